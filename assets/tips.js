() => {
  // Token details on a phone: a token's and a tree node's details live in their title tooltips,
  // which only a mouse pointer opens. A tap (a click) shows the same text in a box under the
  // token, as text (no markup); a tap elsewhere or Escape closes it.
  const tip = document.createElement("div");
  tip.id = "specviz-tip";
  tip.setAttribute("role", "tooltip");
  tip.hidden = true;
  document.body.appendChild(tip);
  const close = () => { tip.hidden = true; };
  document.addEventListener("click", (event) => {
    const token = event.target instanceof Element ? event.target.closest(".tok[title], .tree-node[title]") : null;
    if (token === null || !token.title) return close();
    tip.textContent = token.title;
    tip.hidden = false;
    const box = token.getBoundingClientRect();
    const left = Math.max(4, Math.min(box.left, document.documentElement.clientWidth - tip.offsetWidth - 4));
    tip.style.left = `${left + window.scrollX}px`;
    tip.style.top = `${box.bottom + window.scrollY + 4}px`;
  });
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") close(); });
}
