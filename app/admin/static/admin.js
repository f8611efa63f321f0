// The viewer's only script. Pages work without it; it adds two conveniences:
// - a call's <details> whose body was too big to inline loads it when first opened
//   (server-rendered, escaped HTML from this same origin);
// - "Expand all calls" opens or closes every call of the conversation.
"use strict";

async function loadLazy(details) {
  const holder = details.querySelector(":scope > .lazy[data-src]");
  if (!holder || holder.dataset.state) return;
  holder.dataset.state = "loading";
  try {
    const response = await fetch(holder.dataset.src, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const box = document.createElement("div");
    box.innerHTML = await response.text();
    holder.replaceWith(...box.childNodes);
  } catch (error) {
    holder.dataset.state = "";
    const note = document.createElement("p");
    note.className = "notice bad";
    note.textContent = `Could not load this call (${error.message}); use the link.`;
    holder.append(note);
  }
}

document.addEventListener("toggle", (event) => {
  const details = event.target;
  if (details instanceof HTMLDetailsElement && details.open && details.classList.contains("call")) {
    loadLazy(details);
  }
}, true);

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-action='toggle-calls']");
  if (!button) return;
  const calls = [...document.querySelectorAll("details.call")];
  const open = !calls.every((d) => d.open);
  for (const d of calls) d.open = open;
  button.textContent = open ? "Collapse all calls" : "Expand all calls";
});
