// Attachments in the chat page: pick or drop files, preview them (thumbnails for images),
// send them with the message (multipart), and show files in the conversation (the person's
// attachments and files the agent sent) as thumbnails or download chips.
// Kept apart from app.js, which calls it through window.GatewayAttachments.
// File names only ever reach the page through textContent, never as HTML.
"use strict";

(() => {
  const IMAGE_TYPES = new Set(["image/jpeg", "image/png", "image/gif", "image/webp"]);
  let pending = [];
  let els = null;

  function sizeText(size) {
    if (size < 1024) return `${size} bytes`;
    if (size < 1024 * 1024) return `${(size / 1024).toFixed(1)} KB`;
    return `${(size / (1024 * 1024)).toFixed(1)} MB`;
  }

  function chip(name, detail, href) {
    const link = document.createElement(href ? "a" : "span");
    link.className = "file-chip";
    if (href) {
      link.href = href;
      link.download = name;
    }
    link.textContent = name;
    const small = document.createElement("small");
    small.textContent = ` ${detail}`;
    link.append(small);
    return link;
  }

  function thumbnail(src, name) {
    const img = document.createElement("img");
    img.className = "thumbnail";
    img.alt = name;
    img.src = src;
    return img;
  }

  function filesBox(bubble) {
    let box = bubble.querySelector(":scope > .files");
    if (!box) {
      box = document.createElement("div");
      box.className = "files";
      bubble.prepend(box);
    }
    return box;
  }

  function renderPending() {
    els.list.replaceChildren();
    els.list.hidden = pending.length === 0;
    pending.forEach((entry, index) => {
      const item = document.createElement("li");
      if (entry.preview) item.append(thumbnail(entry.preview, entry.file.name));
      item.append(chip(entry.file.name, sizeText(entry.file.size)));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "quiet remove-file";
      remove.textContent = "×";
      remove.setAttribute("aria-label", `Remove ${entry.file.name}`);
      remove.addEventListener("click", () => {
        pending.splice(index, 1);
        renderPending();
      });
      item.append(remove);
      els.list.append(item);
    });
  }

  function add(files) {
    for (const file of files) {
      const entry = { file, preview: null };
      pending.push(entry);
      if (IMAGE_TYPES.has(file.type)) {
        const reader = new FileReader();
        reader.addEventListener("load", () => {
          entry.preview = reader.result;
          renderPending();
        });
        reader.readAsDataURL(file);
      }
    }
    renderPending();
  }

  // A stored file (history, or one the agent sent): fetched through the API, so the access
  // token travels in a header, then shown from a blob: URL.
  async function fetched(api, url) {
    const response = await api(url);
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    return URL.createObjectURL(await response.blob());
  }

  async function showStored(bubble, files, api) {
    const box = filesBox(bubble);
    for (const file of files) {
      const detail = `${file.media_type}, ${sizeText(file.size)}`;
      if (IMAGE_TYPES.has(file.media_type) && !file.sent) {
        const img = thumbnail("", file.name);
        box.append(img);
        fetched(api, file.url).then((src) => { img.src = src; }, () => img.remove());
      } else {
        const link = chip(file.name, detail, "#");
        link.addEventListener("click", async (event) => {
          event.preventDefault();
          const src = await fetched(api, file.url);
          const a = document.createElement("a");
          a.href = src;
          a.download = file.name;
          a.click();
        });
        box.append(link);
      }
    }
  }

  window.GatewayAttachments = {
    init(elements) {
      els = elements;
      els.button.addEventListener("click", () => els.input.click());
      els.input.addEventListener("change", () => {
        add(els.input.files);
        els.input.value = "";
      });
      for (const name of ["dragenter", "dragover"]) {
        els.dropZone.addEventListener(name, (event) => {
          event.preventDefault();
          els.dropZone.classList.add("dropping");
        });
      }
      els.dropZone.addEventListener("dragleave", () => els.dropZone.classList.remove("dropping"));
      els.dropZone.addEventListener("drop", (event) => {
        event.preventDefault();
        els.dropZone.classList.remove("dropping");
        if (event.dataTransfer && event.dataTransfer.files.length) add(event.dataTransfer.files);
      });
      renderPending();
    },
    // The files to send with the next message; taking them clears the list.
    take() {
      const taken = pending;
      pending = [];
      renderPending();
      return taken;
    },
    // Put files back (the message could not be sent).
    restore(taken) {
      pending = taken.concat(pending);
      renderPending();
    },
    // The person's own bubble: previews from the files just sent.
    showSent(bubble, taken) {
      const box = filesBox(bubble);
      for (const entry of taken) {
        box.append(entry.preview ? thumbnail(entry.preview, entry.file.name)
          : chip(entry.file.name, sizeText(entry.file.size)));
      }
    },
    showStored,
  };
})();
