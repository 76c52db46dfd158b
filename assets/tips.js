() => {
  // Token details on a phone: a token's and a tree node's details live in their title tooltips,
  // which only a mouse pointer opens. A tap (a click) shows the same text in a box beside the
  // token, as text (no markup), below it or, where the screen ends, above; a touch or click
  // anywhere else (the playback slider too: a range input sends no click) or Escape closes it.
  const tip = document.createElement("div");
  tip.id = "specviz-tip";
  tip.setAttribute("role", "tooltip");
  tip.hidden = true;
  document.body.appendChild(tip);
  const tokenAt = (target) =>
    target instanceof Element ? target.closest(".tok[title], .tree-node[title]") : null;
  const close = () => { tip.hidden = true; };
  document.addEventListener("pointerdown", (event) => { if (tokenAt(event.target) === null) close(); });
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") close(); });
  document.addEventListener("click", (event) => {
    const token = tokenAt(event.target);
    if (token === null || !token.title) return close();
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
  });
}
