// The chat page: history from /api/history, turns over /api/chat as Server-Sent Events.
// Text only ever goes into the page through textContent, never as HTML.
"use strict";

(() => {
  const CONVERSATION_KEY = "gateway.conversation";
  const TOKEN_KEY = "gateway.token";
  const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
  const HISTORY_PAGE = 200;

  const $ = (id) => document.getElementById(id);
  const els = {
    messages: $("messages"),
    empty: $("empty"),
    status: $("status"),
    tokenForm: $("token-form"),
    token: $("token"),
    composer: $("composer"),
    text: $("text"),
    send: $("send"),
    session: $("session"),
    sessionId: $("session-id"),
    replay: $("replay-command"),
    newConversation: $("new-conversation"),
  };
  const files = window.GatewayAttachments; // attachments.js: picker, previews, chips

  class NeedsToken extends Error {}

  function randomId(prefix) {
    const bytes = new Uint8Array(8);
    crypto.getRandomValues(bytes);
    return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function conversation() {
    let id = localStorage.getItem(CONVERSATION_KEY);
    if (!id || !NAME_PATTERN.test(id) || id.includes("..")) {
      id = randomId("c-");
      localStorage.setItem(CONVERSATION_KEY, id);
    }
    return id;
  }

  function setStatus(text) {
    els.status.textContent = text || "";
  }

  function askToken() {
    els.tokenForm.hidden = false;
    els.token.focus();
  }

  async function api(path, options = {}) {
    const headers = { ...(options.headers || {}) };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const response = await fetch(path, { ...options, headers });
    if (response.status === 401) {
      askToken();
      throw new NeedsToken("This gateway needs an access token.");
    }
    return response;
  }

  async function errorOf(response) {
    try {
      const body = await response.json();
      return body.error || `HTTP ${response.status}`;
    } catch {
      return `HTTP ${response.status}`;
    }
  }

  function scrollToEnd() {
    const main = els.messages.parentElement;
    main.scrollTop = main.scrollHeight;
  }

  function addMessage(role, text) {
    const item = document.createElement("li");
    item.className = `message ${role}`;
    item.dataset.role = role;
    item.textContent = text;
    els.messages.append(item);
    els.empty.hidden = true;
    scrollToEnd();
    return item;
  }

  function showSession(id) {
    if (!id) {
      els.session.hidden = true;
      return;
    }
    els.sessionId.textContent = id;
    els.replay.textContent = `gateway replay ${id}`;
    els.session.hidden = false;
  }

  async function loadHistory() {
    els.messages.replaceChildren();
    els.empty.hidden = false;
    showSession(null);
    const conv = encodeURIComponent(conversation());
    try {
      const head = await api(`/api/history?conversation=${conv}&limit=0`);
      if (!head.ok) return setStatus(await errorOf(head));
      const { session, total } = await head.json();
      if (!session) return;
      const offset = Math.max(0, total - HISTORY_PAGE);
      const page = await api(
        `/api/history?conversation=${conv}&offset=${offset}&limit=${HISTORY_PAGE}`,
      );
      if (!page.ok) return setStatus(await errorOf(page));
      const body = await page.json();
      for (const m of body.messages) {
        const own = (m.files || []).filter((f) => !f.sent);
        const sent = (m.files || []).filter((f) => f.sent); // files the agent sent
        if ((m.text || own.length) && (m.role === "user" || m.role === "assistant")) {
          const item = addMessage(m.role, m.text || "");
          if (own.length) files.showStored(item, own, api);
        }
        if (sent.length) files.showStored(addMessage("assistant", ""), sent, api);
      }
      showSession(body.session);
    } catch (err) {
      setStatus(err.message);
    }
  }

  function parseEvent(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    if (!data.length) return null; // a keepalive comment
    return { name, data: JSON.parse(data.join("\n")) };
  }

  function settle(bubble, text, failed) {
    bubble.classList.remove("pending");
    bubble.removeAttribute("aria-busy");
    if (failed) bubble.classList.add("error");
    bubble.textContent = text;
    scrollToEnd();
  }

  // The request: JSON for text alone, multipart/form-data when files go with it.
  function chatRequest(text, taken) {
    const fields = { conversation: conversation(), text, id: randomId("m-"), stream: true };
    if (!taken.length) {
      return {
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify(fields),
      };
    }
    const form = new FormData();
    for (const [key, value] of Object.entries(fields)) form.append(key, String(value));
    for (const entry of taken) form.append("file", entry.file, entry.file.name);
    return { headers: { Accept: "text/event-stream" }, body: form };
  }

  async function send(text) {
    const taken = files.take();
    const mine = addMessage("user", text);
    files.showSent(mine, taken);
    const bubble = addMessage("assistant", "");
    bubble.classList.add("pending");
    bubble.setAttribute("aria-busy", "true");
    let response;
    try {
      response = await api("/api/chat", { method: "POST", ...chatRequest(text, taken) });
    } catch (err) {
      bubble.remove();
      mine.remove();
      files.restore(taken);
      if (err instanceof NeedsToken) els.text.value = text;
      return setStatus(err.message);
    }
    if (!response.ok) return settle(bubble, await errorOf(response), true);

    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
        if (!event) continue;
        if (event.name === "session") {
          showSession(event.data.session);
        } else if (event.name === "delta") {
          bubble.textContent += event.data.text;
          scrollToEnd();
        } else if (event.name === "file") {  // a file the agent sent: before its answer
          const item = addMessage("assistant", "");
          bubble.before(item);
          files.showStored(item, [event.data], api);
        } else if (event.name === "done") {
          settle(bubble, event.data.reply, false);
          finished = true;
        } else if (event.name === "error") {
          settle(bubble, event.data.error, true);
          finished = true;
        }
      }
    }
    if (!finished) settle(bubble, bubble.textContent || "The connection closed early.", true);
  }

  els.composer.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = els.text.value.trim();
    if (!text && !document.querySelector("#pending-files li")) return;
    els.text.value = "";
    setStatus("");
    els.send.disabled = true;
    try {
      await send(text);
    } catch (err) {
      setStatus(err.message);
    } finally {
      els.send.disabled = false;
      els.text.focus();
    }
  });

  els.text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (!els.send.disabled) els.composer.requestSubmit();
    }
  });

  els.tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, els.token.value.trim());
    els.token.value = "";
    els.tokenForm.hidden = true;
    setStatus("");
    loadHistory();
  });

  els.newConversation.addEventListener("click", () => {
    localStorage.setItem(CONVERSATION_KEY, randomId("c-"));
    setStatus("");
    loadHistory();
    els.text.focus();
  });

  files.init({
    button: $("attach"), input: $("files"), list: $("pending-files"), dropZone: els.composer,
  });
  loadHistory();
})();
