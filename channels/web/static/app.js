// The chat page: history from /api/history, turns over /api/chat as Server-Sent Events.
// What people type goes into the page through textContent only; the agent's answers are
// Markdown, rendered by markdown.js (raw HTML off, then sanitized) and nowhere else.
// A message that could not reach the gateway stays on the page marked "not sent", with Retry.
// Messages the agent writes unasked (a reminder firing) are picked up from the history.
"use strict";

(() => {
  const CONVERSATION_KEY = "gateway.conversation";
  const TOKEN_KEY = "gateway.token";
  const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
  const HISTORY_PAGE = 200;
  const WATCH_MS = 5000; // how often an idle, visible page looks for messages sent unasked

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
  const markdown = window.GatewayMarkdown; // markdown.js: safe rendering of answers
  const rawText = new WeakMap(); // assistant bubble -> its Markdown source so far
  const OFFLINE = "Cannot reach the gateway: check that it is running and your connection.";

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

  // The status line; with `retry`, a Retry button that runs it (and clears the line).
  function setStatus(text, retry) {
    els.status.textContent = text || "";
    els.status.classList.toggle("problem", Boolean(retry));
    if (!retry) return;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "quiet retry";
    button.textContent = "Retry";
    button.addEventListener("click", () => {
      setStatus("");
      retry();
    });
    els.status.append(" ", button);
  }

  // fetch() rejects with a TypeError when the request never got an answer (server down,
  // network gone): the one failure where nothing reached the gateway.
  function unreachable(err) {
    return err instanceof TypeError;
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

  function setAnswer(bubble, text) {
    rawText.set(bubble, text);
    markdown.render(bubble, text);
  }

  // Streamed deltas re-render at most once a frame: Markdown is parsed whole each time (a
  // half-written list or code fence renders as what it is so far).
  const dirty = new Set();
  function appendDelta(bubble, text) {
    rawText.set(bubble, (rawText.get(bubble) || "") + text);
    if (!dirty.size) {
      requestAnimationFrame(() => {
        for (const item of dirty) markdown.render(item, rawText.get(item) || "");
        dirty.clear();
        scrollToEnd();
      });
    }
    dirty.add(bubble);
  }

  function addMessage(role, text) {
    const item = document.createElement("li");
    item.className = `message ${role}`;
    item.dataset.role = role;
    if (role === "assistant" && text) setAnswer(item, text);
    else item.textContent = text;
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
    // The command as the operator types it on the gateway's machine (set by the server).
    const command = els.replay.dataset.command || "gateway replay {session}";
    els.replay.textContent = command.replace("{session}", id);
    els.session.hidden = false;
  }

  // The history's length this view shows (its `data-total`), or null when not known.
  let shown = null;
  function setShown(total) {
    shown = total;
    if (total === null) delete els.messages.dataset.total;
    else els.messages.dataset.total = String(total);
  }

  async function historyTotal() {
    const conv = encodeURIComponent(conversation());
    const head = await api(`/api/history?conversation=${conv}&limit=0`);
    return head.ok ? (await head.json()).total : null;
  }

  // Idle (nothing being sent, nothing left unsent) and visible: a history that grew holds a
  // message nobody asked for here, a reminder firing: the view is shown again from it.
  async function watch() {
    if (document.hidden || els.send.disabled || !els.tokenForm.hidden) return;
    if (document.querySelector(".message.pending, .message.unsent")) return;
    try {
      const total = await historyTotal();
      if (total === null || els.send.disabled) return;
      if (shown === null) setShown(total);
      else if (total > shown) await loadHistory();
    } catch {
      // Unreachable or signed out: the next look tries again; sending says what is wrong.
    }
  }

  async function loadHistory() {
    els.messages.replaceChildren();
    els.empty.hidden = false;
    showSession(null);
    setShown(null);
    const conv = encodeURIComponent(conversation());
    try {
      const head = await api(`/api/history?conversation=${conv}&limit=0`);
      if (!head.ok) return setStatus(await errorOf(head));
      const { session, total } = await head.json();
      setShown(total);
      if (!session) return;
      const offset = Math.max(0, total - HISTORY_PAGE);
      const page = await api(
        `/api/history?conversation=${conv}&offset=${offset}&limit=${HISTORY_PAGE}`,
      );
      if (!page.ok) return setStatus(await errorOf(page));
      const body = await page.json();
      // One answer per turn, as it streamed: the texts of a turn's calls (before and after a
      // tool round) go in one bubble, a blank line apart, as the gateway joins them.
      let answer = null;
      for (const m of body.messages) {
        const own = (m.files || []).filter((f) => !f.sent);
        const sent = (m.files || []).filter((f) => f.sent); // files the agent sent
        if (m.role === "user" && (m.text || own.length)) {
          answer = null; // a person's message (or a schedule's trigger) starts the next turn
          // A scheduled turn's trigger was not typed by the person: shown as a note.
          const item = addMessage(m.scheduled ? "scheduled" : "user", m.text || "");
          if (own.length) files.showStored(item, own, api);
        } else if (m.role === "assistant" && (m.text || own.length)) {
          const before = answer && rawText.get(answer);
          if (answer && m.text) setAnswer(answer, before ? `${before}\n\n${m.text}` : m.text);
          else if (!answer) answer = addMessage("assistant", m.text || "");
          if (own.length) files.showStored(answer, own, api);
        }
        if (sent.length) files.showStored(addMessage("assistant", ""), sent, api);
      }
      showSession(body.session);
    } catch (err) {
      setStatus(unreachable(err) ? OFFLINE : err.message, unreachable(err) ? loadHistory : null);
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
    dirty.delete(bubble);
    bubble.classList.remove("pending");
    bubble.removeAttribute("aria-busy");
    if (failed) {
      bubble.classList.add("error");
      bubble.classList.remove("markdown");
      bubble.textContent = text; // our own error text, not the model's
    } else {
      setAnswer(bubble, text);
    }
    scrollToEnd();
  }

  // The message stays, marked "not sent", with a Retry that sends it again (same id, so a
  // request that did arrive after all is not answered twice).
  function markUnsent(mine, retry) {
    mine.classList.add("unsent");
    const note = document.createElement("span");
    note.className = "unsent-note";
    note.textContent = "Not sent. ";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "quiet retry";
    button.textContent = "Retry";
    button.addEventListener("click", async () => {
      note.remove();
      mine.classList.remove("unsent");
      setStatus("");
      await retry();
    }, { once: true });
    note.append(button);
    mine.append(note);
    setStatus(OFFLINE);
  }

  // The request: JSON for text alone, multipart/form-data when files go with it.
  function chatRequest(text, taken, id) {
    const fields = { conversation: conversation(), text, id, stream: true };
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
    await deliver(mine, text, taken, randomId("m-"));
  }

  async function deliver(mine, text, taken, id) {
    const bubble = addMessage("assistant", "");
    bubble.classList.add("pending");
    bubble.setAttribute("aria-busy", "true");
    let response;
    try {
      response = await api("/api/chat", { method: "POST", ...chatRequest(text, taken, id) });
    } catch (err) {
      bubble.remove();
      if (unreachable(err)) return markUnsent(mine, () => deliver(mine, text, taken, id));
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
      let chunk;
      try {
        chunk = await reader.read();
      } catch {
        break; // the connection dropped mid-answer: settled as cut short below
      }
      const { value, done } = chunk;
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
          appendDelta(bubble, event.data.text);
        } else if (event.name === "retract") {  // its worker lost the conversation: start over
          setAnswer(bubble, "");
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
    if (!finished) {
      settle(bubble, rawText.get(bubble) || "The connection closed early.", true);
    }
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
      // What this view now shows includes the turn just answered: the history's length.
      if (!document.querySelector(".message.unsent")) setShown(await historyTotal());
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

  window.addEventListener("offline", () => setStatus("You are offline."));
  window.addEventListener("online", () => setStatus(""));

  files.init({
    button: $("attach"), input: $("files"), list: $("pending-files"), dropZone: els.composer,
  });
  loadHistory();
  setInterval(watch, WATCH_MS);
})();
