// lmserve autocomplete page: the text before the caret, sent on every key over /ws/complete
// (one lmserve.v1.CompleteRequest in proto3 JSON per frame; one CompleteResponse per answer).
//
// The session's committed context is kept here as groups of words with the tokens the server
// appended for them (`appendedTokens`). Each keystroke compares the words before the caret
// with the groups: the groups that no longer match are rolled back (`rollbackTokens`, or
// `reset` when none is left), the new whole words appended (`appendText`), and the word being
// typed is the `partialWord`. On a new socket the first message carries the model, the
// session id, the whole committed context (`context.tokens`) and the finished sentences
// (`history`), so a restarted server or another replica rebuilds the session and its cache. A
// sentence end commits the sentence's last word before the reset that starts the next one.
"use strict";

(() => {
  const LIST_MODELS = "lmserve.v1.LanguageModelService/ListModels";
  const SOCKET = "ws/complete";
  const RECENT = 200; // round trips kept for p50/p99
  const MAX_K = 20;

  const $ = (id) => document.getElementById(id);
  const editor = $("editor");
  const list = $("suggestions");
  const modelSelect = $("model");
  const kInput = $("k");
  const tokenField = $("token-field");
  const tokenInput = $("token");
  const statusEl = $("status");

  // The model is remembered; the token only for this tab's session.
  const storage = (key) => (key === "lmserve.token" ? window.sessionStorage : window.localStorage);
  const stored = (key) => {
    try { return storage(key).getItem(key); } catch { return null; }
  };
  const store = (key, value) => {
    try { storage(key).setItem(key, value); } catch { /* storage disabled */ }
  };

  // -- state -------------------------------------------------------------------------------
  let token = stored("lmserve.token") || "";
  let socket = null; // the WebSocket, while connecting or open
  let socketOpen = false;
  let opening = true; // the next message is a new socket's first
  let sessionId = "";
  let groups = []; // [{words: [...], tokens: [...] | null (not answered yet)}]
  // Finished sentences (a reset moves the context here): the session's cache counts them, and
  // a new socket sends them with the context so a rebuilt session answers the same words.
  let history = [];
  let pendingGroups = new Map(); // sequence -> group appended by that message
  let sequence = 0;
  let sentAt = new Map(); // sequence -> performance.now() when sent
  let lastKey = null; // what the last message asked (words, partial, k)
  let waiting = false; // a rollback waits for the tokens of words not answered yet
  let closedAt = 0; // where the sentence whose last words were committed ended
  let suggestions = [];
  let highlight = 0;
  let dismissed = false;
  let shownPartial = "";
  let socketError = null; // the error frame that ended the socket, if any
  let reconnectDelay = 250;
  let reconnectTimer = null;
  const roundTrips = [];

  // -- status and numbers ------------------------------------------------------------------
  function setStatus(text, kind) {
    statusEl.dataset.kind = kind;
    statusEl.querySelector("span").textContent = text;
    document.body.dataset.state = kind === "ok" ? "connected" : kind;
  }

  function ms(value) {
    return value < 10 ? `${value.toFixed(2)} ms` : `${value.toFixed(1)} ms`;
  }

  function quantile(sorted, q) {
    return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  }

  function recordRoundTrip(value) {
    roundTrips.push(value);
    if (roundTrips.length > RECENT) roundTrips.shift();
    const sorted = [...roundTrips].sort((a, b) => a - b);
    $("rtt-last").textContent = ms(value);
    $("rtt-p50").textContent = ms(quantile(sorted, 0.5));
    $("rtt-p99").textContent = ms(quantile(sorted, 0.99));
    $("rtt-n").textContent = String(Number($("rtt-n").textContent) + 1);
  }

  function percent(logProb) {
    const p = Math.exp(logProb) * 100;
    if (p >= 10) return `${Math.round(p)}%`;
    if (p >= 0.1) return `${p.toFixed(1)}%`;
    return "<0.1%";
  }

  // -- the text before the caret -----------------------------------------------------------
  function typed() {
    const caret = editor.selectionEnd;
    const before = editor.value.slice(0, caret);
    const ends = before.match(/^[\s\S]*[.!?\n]/);
    const start = ends ? ends[0].length : 0;
    const sentence = before.slice(start);
    const partial = sentence.match(/\S*$/)[0];
    const head = sentence.slice(0, sentence.length - partial.length);
    const words = head.split(/\s+/).filter(Boolean);
    // The sentence the last end mark closed: its words, and where it ended.
    const closed = ends ? ends[0].slice(0, -1) : "";
    const closedStart = closed.match(/^[\s\S]*[.!?\n]/);
    const previous = closed.slice(closedStart ? closedStart[0].length : 0).split(/\s+/);
    return {
      words,
      partial,
      caret,
      partialStart: caret - partial.length,
      closedAt: start,
      previous: previous.filter(Boolean),
    };
  }

  function currentK() {
    const k = Math.round(Number(kInput.value));
    return Number.isFinite(k) ? Math.min(MAX_K, Math.max(1, k)) : 5;
  }

  function startsWithGroup(words, at, group) {
    if (at + group.words.length > words.length) return false;
    return group.words.every((word, i) => words[at + i] === word);
  }

  function committedTokens() {
    return groups.flatMap((group) => group.tokens || []);
  }

  // -- sending -----------------------------------------------------------------------------
  function update(force = false) {
    if (!modelSelect.value) return;
    if (!socketOpen) {
      connect();
      return;
    }
    if (waiting) return; // sent when the answer with the missing tokens arrives
    const now = typed();
    const k = currentK();
    const key = JSON.stringify([now.words, now.partial, k]);
    if (!force && !opening && key === lastKey) {
      place();
      return;
    }
    let keep = 0;
    let at = 0;
    while (keep < groups.length && startsWithGroup(now.words, at, groups[keep])) {
      at += groups[keep].words.length;
      keep += 1;
    }
    const dropped = groups.slice(keep);
    if (keep > 0 && dropped.some((group) => group.tokens === null)) {
      waiting = true;
      return;
    }
    if (commitClosedSentence(now, keep, k)) return;
    sequence += 1;
    const message = { sequence, k, partialWord: now.partial };
    if (opening) {
      message.model = modelSelect.value;
      if (sessionId) {
        message.sessionId = sessionId;
        message.context = { tokens: committedTokens() };
        message.history = { sentences: history.map((tokens) => ({ tokens })) };
      }
    }
    if (dropped.length > 0) {
      if (keep === 0) {
        message.reset = true;
        const finished = committedTokens();
        if (finished.length > 0) history.push(finished);
      }
      else message.rollbackTokens = dropped.reduce((n, group) => n + group.tokens.length, 0);
    }
    groups.length = keep;
    const appended = now.words.slice(at);
    if (appended.length > 0) {
      const group = { words: appended, tokens: null };
      groups.push(group);
      pendingGroups.set(sequence, group);
      message.appendText = appended.join(" ");
    }
    lastKey = key;
    opening = false;
    dismissed = false;
    editor.dataset.sent = String(sequence);
    sentAt.set(sequence, performance.now());
    socket.send(JSON.stringify(message));
  }

  // A sentence end (".", "!", "?", a new line) closes the sentence being typed: its last word,
  // never followed by a space, is appended first, and the reset that starts the next sentence
  // waits for its tokens, so the whole sentence joins the session's history (its cache).
  function commitClosedSentence(now, keep, k) {
    if (opening || keep > 0 || now.closedAt === closedAt) return false;
    closedAt = now.closedAt;
    const held = groups.flatMap((group) => group.words);
    const finished = now.previous;
    if (finished.length <= held.length || !held.every((word, i) => finished[i] === word)) {
      return false;
    }
    if (groups.some((group) => group.tokens === null)) {
      waiting = true;
      closedAt = -1; // looked at again once the tokens are back
      return true;
    }
    sequence += 1;
    const group = { words: finished.slice(held.length), tokens: null };
    groups.push(group);
    pendingGroups.set(sequence, group);
    waiting = true; // the reset is sent when this answer brings the tokens
    lastKey = null;
    sentAt.set(sequence, performance.now());
    socket.send(JSON.stringify({ sequence, k, partialWord: "", appendText: group.words.join(" ") }));
    return true;
  }

  function answered(data) {
    if (data.error) {
      socketError = data.error;
      return; // the server closes the socket next
    }
    const seq = Number(data.sequence || 0);
    const started = sentAt.get(seq);
    sentAt.delete(seq);
    if (started !== undefined) recordRoundTrip(performance.now() - started);
    const group = pendingGroups.get(seq);
    if (group) {
      group.tokens = data.appendedTokens || [];
      pendingGroups.delete(seq);
    }
    sessionId = data.sessionId || sessionId;
    $("session").textContent = sessionId || "–";
    $("session").title = sessionId;
    const tokens = data.contextTokens || 0;
    $("context").textContent = `${tokens} token${tokens === 1 ? "" : "s"}`;
    if (seq === sequence && !data.skipped) {
      suggestions = data.completions || [];
      shownPartial = typed().partial;
      highlight = 0;
      list.dataset.sequence = String(seq);
      render();
    }
    if (waiting && pendingGroups.size === 0) {
      waiting = false;
      update();
    }
  }

  // -- the socket --------------------------------------------------------------------------
  function socketUrl() {
    const url = new URL(SOCKET, window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (token) url.searchParams.set("access_token", token);
    return url;
  }

  function connect() {
    if (socket || !modelSelect.value) return;
    window.clearTimeout(reconnectTimer);
    socketError = null;
    const ws = new WebSocket(socketUrl());
    socket = ws;
    setStatus("connecting…", "busy");
    ws.onopen = () => {
      if (socket !== ws) return;
      socketOpen = true;
      opening = true;
      document.body.dataset.sockets = String(Number(document.body.dataset.sockets || 0) + 1);
      reconnectDelay = 250;
      setStatus(`connected · ${modelSelect.value}`, "ok");
      update(true);
    };
    ws.onmessage = (event) => {
      if (socket === ws) answered(JSON.parse(event.data));
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      forgetSocket();
      if (socketError) {
        // Refused: shown, and tried again on the next key (a new socket, the same session).
        if (socketError.code === "unauthenticated") tokenField.hidden = false;
        setStatus(`${socketError.code}: ${socketError.message}`, "error");
        return;
      }
      setStatus(`reconnecting… (closed ${event.code})`, "busy");
      reconnectTimer = window.setTimeout(connect, reconnectDelay);
      reconnectDelay = Math.min(reconnectDelay * 2, 5000);
    };
  }

  function forgetSocket() {
    socket = null;
    socketOpen = false;
    opening = true;
    waiting = false;
    lastKey = null;
    // Words whose tokens never came back are sent again (the context is rebuilt without them).
    const unanswered = groups.findIndex((group) => group.tokens === null);
    if (unanswered >= 0) groups.length = unanswered;
    pendingGroups = new Map();
    sentAt = new Map();
  }

  function restart() {
    // Another model or token: a new session on a new socket.
    if (socket) {
      const old = socket;
      socket = null;
      old.close(1000);
    }
    forgetSocket();
    groups = [];
    sessionId = "";
    history = [];
    closedAt = 0;
    suggestions = [];
    render();
    connect();
  }

  // -- the suggestion list -----------------------------------------------------------------
  const MIRRORED = [
    "boxSizing", "width", "borderTopWidth", "borderRightWidth", "borderBottomWidth",
    "borderLeftWidth", "borderStyle", "paddingTop", "paddingRight", "paddingBottom",
    "paddingLeft", "fontStyle", "fontVariant", "fontWeight", "fontStretch", "fontSize",
    "lineHeight", "fontFamily", "textAlign", "textTransform", "textIndent", "letterSpacing",
    "wordSpacing", "tabSize",
  ];

  function caretPoint(position) {
    // A hidden copy of the textarea, up to `position`, tells where that character is drawn.
    const style = window.getComputedStyle(editor);
    const mirror = document.createElement("div");
    for (const name of MIRRORED) mirror.style[name] = style[name];
    mirror.style.position = "absolute";
    mirror.style.visibility = "hidden";
    mirror.style.top = "0";
    mirror.style.left = "-10000px";
    mirror.style.whiteSpace = "pre-wrap";
    mirror.style.overflowWrap = "break-word";
    mirror.style.overflowY = editor.scrollHeight > editor.clientHeight ? "scroll" : "hidden";
    mirror.textContent = editor.value.slice(0, position);
    const marker = document.createElement("span");
    marker.textContent = editor.value.slice(position) || ".";
    mirror.appendChild(marker);
    document.body.appendChild(mirror);
    const point = {
      top: marker.offsetTop - editor.scrollTop,
      left: marker.offsetLeft - editor.scrollLeft,
      line: parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.4,
    };
    mirror.remove();
    return point;
  }

  function place() {
    if (list.hidden) return;
    const now = typed();
    const point = caretPoint(now.partialStart);
    const wrap = editor.parentElement;
    let left = editor.offsetLeft + point.left - 12;
    let top = editor.offsetTop + point.top + point.line + 4;
    const width = list.offsetWidth;
    left = Math.max(0, Math.min(left, wrap.clientWidth - width));
    if (top + list.offsetHeight > editor.offsetTop + editor.offsetHeight + 140) {
      top = editor.offsetTop + point.top - list.offsetHeight - 4; // above the line instead
    }
    list.style.left = `${left}px`;
    list.style.top = `${top}px`;
  }

  function render() {
    list.replaceChildren();
    const visible = document.activeElement === editor && !dismissed && socketOpen;
    if (!visible || suggestions.length === 0) {
      list.hidden = true;
      return;
    }
    suggestions.forEach((completion, index) => {
      const item = document.createElement("li");
      item.setAttribute("role", "option");
      item.setAttribute("aria-selected", String(index === highlight));
      item.dataset.word = completion.word;
      const word = document.createElement("span");
      word.className = "word";
      const typedPart = completion.word.slice(0, shownPartial.length);
      if (typedPart.toLowerCase() === shownPartial.toLowerCase() && shownPartial) {
        const bold = document.createElement("b");
        bold.textContent = typedPart;
        word.append(bold, completion.word.slice(shownPartial.length));
      } else {
        word.textContent = completion.word;
      }
      const prob = document.createElement("span");
      prob.className = "prob";
      prob.textContent = percent(completion.logProb || 0);
      item.append(word, prob);
      item.addEventListener("mousedown", (event) => {
        event.preventDefault(); // keep the caret in the text
        accept(index);
      });
      list.appendChild(item);
    });
    list.hidden = false;
    place();
  }

  function accept(index) {
    const completion = suggestions[index];
    if (!completion) return;
    const now = typed();
    let word = completion.word;
    if (/^\p{Lu}/u.test(now.partial)) word = word.charAt(0).toUpperCase() + word.slice(1);
    const rest = editor.value.slice(now.caret).match(/^\S*/)[0];
    const spaced = /^\s/.test(editor.value.slice(now.caret + rest.length));
    editor.focus();
    editor.setSelectionRange(now.partialStart, now.caret + rest.length);
    const text = spaced ? word : `${word} `;
    // insertText keeps the browser's undo history; setRangeText where it is not supported.
    if (!document.execCommand("insertText", false, text)) {
      editor.setRangeText(text, now.partialStart, now.caret + rest.length, "end");
    }
    if (spaced) editor.setSelectionRange(editor.selectionEnd + 1, editor.selectionEnd + 1);
    update();
  }

  // -- models ------------------------------------------------------------------------------
  async function loadModels() {
    setStatus("loading models…", "busy");
    const headers = { "content-type": "application/json" };
    if (token) headers.authorization = `Bearer ${token}`;
    let response;
    try {
      response = await fetch(LIST_MODELS, { method: "POST", headers, body: "{}" });
    } catch {
      setStatus("server unreachable; retrying…", "error");
      window.setTimeout(loadModels, 2000);
      return;
    }
    if (response.status === 401) {
      tokenField.hidden = false;
      setStatus(token ? "the token was refused" : "this server needs a token", "error");
      tokenInput.focus();
      return;
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      setStatus(body.message || `ListModels: HTTP ${response.status}`, "error");
      return;
    }
    const models = (body.models || []).filter((m) => m.capabilities && m.capabilities.complete);
    modelSelect.replaceChildren(
      ...models.map((m) => {
        const option = document.createElement("option");
        option.value = m.name;
        option.textContent = m.name;
        option.title = m.description || "";
        return option;
      }),
    );
    if (models.length === 0) {
      setStatus("no model here can complete", "error");
      return;
    }
    const wanted = new URLSearchParams(window.location.search).get("model") || stored("lmserve.model");
    if (wanted && models.some((m) => m.name === wanted)) modelSelect.value = wanted;
    restart();
    editor.focus();
  }

  // -- events ------------------------------------------------------------------------------
  editor.addEventListener("input", () => update());
  editor.addEventListener("click", () => update());
  editor.addEventListener("keyup", (event) => {
    if (["ArrowLeft", "ArrowRight", "Home", "End", "PageUp", "PageDown"].includes(event.key)) {
      update();
    }
  });
  editor.addEventListener("keydown", (event) => {
    if (event.isComposing) return;
    const open = !list.hidden && suggestions.length > 0;
    if (!open) return;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      highlight = (highlight + step + suggestions.length) % suggestions.length;
      render();
    } else if (event.key === "Tab" && !event.shiftKey) {
      event.preventDefault();
      accept(highlight);
    } else if (event.key === "Escape") {
      event.preventDefault();
      dismissed = true;
      render();
    }
  });
  editor.addEventListener("focus", () => {
    render();
    if (!socket) update();
  });
  editor.addEventListener("blur", () => { list.hidden = true; });
  editor.addEventListener("scroll", place);
  window.addEventListener("resize", place);

  modelSelect.addEventListener("change", () => {
    store("lmserve.model", modelSelect.value);
    restart();
    editor.focus();
  });
  kInput.addEventListener("change", () => {
    kInput.value = String(currentK());
    update(true);
  });
  tokenInput.value = token;
  tokenInput.addEventListener("change", () => {
    token = tokenInput.value.trim();
    store("lmserve.token", token);
    loadModels();
  });
  $("controls").addEventListener("submit", (event) => event.preventDefault());

  // For the console and the browser test: drop the socket as a network failure would.
  window.lmserveAutocomplete = {
    dropSocket: () => socket && socket.close(4000, "dropped from the console"),
  };

  loadModels();
})();
