() => {
  // Token details on a phone: a token's and a tree node's details live in their title tooltips,
  // which only a mouse pointer opens. A tap (a click) shows the same text in a box beside the
  // token, as text (no markup), below it or, where the screen ends, above; a touch or click
  // anywhere else (the playback slider too: a range input sends no click) or Escape closes it.
  // On a keyboard a view of tokens ([data-tips], one Tab stop) steps through them with the arrow
  // keys, Home and End, showing each one's box; the box is a live region, so a screen reader
  // reads it too, as it reads the statuses a job updates.
  const tip = document.createElement("div");
  tip.id = "specviz-tip";
  tip.setAttribute("role", "tooltip");
  tip.setAttribute("aria-live", "polite");
  tip.hidden = true;
  document.body.appendChild(tip);
  const TOKENS = ".tok[title], .tree-node[title], .tree-path[title]";  // a path: the overview's bars in words
  const tokenAt = (target) => (target instanceof Element ? target.closest(TOKENS) : null);
  const unmark = () => document.querySelectorAll(".tip-current").forEach((t) => t.classList.remove("tip-current"));
  const close = () => { tip.hidden = true; unmark(); };
  const show = (token) => {
    tip.textContent = token.title;
    tip.style.left = "0px";  // measured where the last box stood, it was narrowed by the screen's edge
    tip.style.top = "0px";
    tip.hidden = false;
    const box = token.getBoundingClientRect();
    const width = document.documentElement.clientWidth, height = document.documentElement.clientHeight;
    const left = Math.max(4, Math.min(box.left, width - tip.offsetWidth - 4));
    const below = box.bottom + 4 + tip.offsetHeight <= height || box.top - 4 - tip.offsetHeight < 0;
    tip.style.left = `${left + window.scrollX}px`;
    tip.style.top = `${(below ? box.bottom + 4 : box.top - 4 - tip.offsetHeight) + window.scrollY}px`;
  };
  document.addEventListener("pointerdown", (event) => { if (tokenAt(event.target) === null) close(); });
  document.addEventListener("click", (event) => {
    const token = tokenAt(event.target);
    if (token === null || !token.title) return close();
    unmark();
    // the token tapped is where the arrow keys go on from (they started over at the first)
    if (token.closest("[data-tips]") !== null) token.classList.add("tip-current");
    show(token);
  });
  const STEPS = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1, Home: -Infinity, End: Infinity };
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") return close();
    const view = event.target instanceof Element ? event.target.closest("[data-tips]") : null;
    if (view === null || !(event.key in STEPS)) return;
    const tokens = [...view.querySelectorAll(TOKENS)];
    if (tokens.length === 0) return;
    event.preventDefault();  // the keys step through the tokens, not the page's scroll
    const at = tokens.findIndex((t) => t.classList.contains("tip-current"));
    const step = STEPS[event.key];
    const next = Math.max(0, Math.min(tokens.length - 1, at < 0 && step > 0 && step < Infinity ? 0 : at + step));
    unmark();
    tokens[next].classList.add("tip-current");
    tokens[next].scrollIntoView({ block: "nearest", inline: "nearest" });
    show(tokens[next]);
  });
  document.addEventListener("focusout", (event) => {
    if (event.target instanceof Element && event.target.matches("[data-tips]")) close();
  });
  // what a job says on its status is read out as it changes (the page had no live region of its own)
  // (a tab's or an accordion's statuses are drawn when first opened, after this runs: watched for)
  const statuses = ["status", "lab-info", "e2e-out", "replay-status"];
  const live = () => statuses.forEach((id) => {
    const status = document.getElementById(id);
    if (status !== null && !status.hasAttribute("aria-live")) status.setAttribute("aria-live", "polite");
  });
  live();
  // Gradio draws a plot afresh, in a new element, at every update of it (a streaming run's five
  // plots every few seconds, each step of the k explorer's slider) and drops the old element
  // without Plotly.purge: Plotly's window "resize" listener (Gradio's plots are responsive) kept
  // every old drawing alive, 6 MB and 15,000 nodes more each 512-token run, for as long as the
  // tab stayed open, and each resize (a tab shown: app.REDRAW_JS) visited them all. A plot taken
  // off the page is purged, which removes that listener: two seconds later, once the redraws
  // Plotly had under way for it are done (purged at once, a pending margin redraw read the
  // purged layout and threw), and only if it is still off the page.
  const purge = (records) => {
    for (const record of records) {
      for (const node of record.removedNodes) {
        if (!(node instanceof Element) || node.isConnected) continue;
        const plots = node.matches(".js-plotly-plot") ? [node] : node.querySelectorAll(".js-plotly-plot");
        for (const plot of plots) {
          setTimeout(() => {
            if (plot.isConnected) return;
            try { window.Plotly?.purge(plot); } catch (e) {}  // a plot half drawn: what is left goes
          }, 2000);
        }
      }
    }
  };
  new MutationObserver((records) => { live(); purge(records); })
    .observe(document.body, { childList: true, subtree: true });
}
