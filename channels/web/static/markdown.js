// The agent's answers as Markdown, rendered safely: markdown-it with raw HTML switched off (a
// model that writes <script> or <img onerror=...> shows that text, nothing runs), then DOMPurify
// over the result as a second wall. Images are dropped (an image URL is how a prompt injection
// smuggles data out; the page's CSP blocks other hosts anyway); links open in a new tab with no
// referrer. Both libraries are vendored from npm (markdown-it 15.0.3, DOMPurify 3.5.0): the
// page loads nothing from elsewhere.
"use strict";

window.GatewayMarkdown = (() => {
  const md = window.markdownit({ html: false, linkify: true, breaks: true });
  const purify = window.DOMPurify;
  purify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });
  const OPTIONS = {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style"],
  };

  // Markdown -> sanitized HTML string (exported for tests and the page).
  function toHtml(text) {
    return purify.sanitize(md.render(text || ""), OPTIONS);
  }

  // Put the rendered Markdown into `element`, replacing what it held.
  function render(element, text) {
    element.innerHTML = toHtml(text); // sanitized just above: the one place HTML goes in
    element.classList.add("markdown");
  }

  return { render, toHtml };
})();
