// Warren dashboard: live numbers (server-sent events) and the terminal.
// Everything from the server is data: it is written with textContent
// only, never parsed as HTML.
"use strict";

function csrf() {
  const m = document.querySelector('meta[name="csrf"]');
  return m ? m.content : "";
}

// Live numbers: each event is a JSON object; an element with
// data-live="key" shows the value of key.
function live() {
  const url = document.body.dataset.liveUrl;
  if (!url) return;
  const es = new EventSource(url);
  es.onmessage = (ev) => {
    let v;
    try { v = JSON.parse(ev.data); } catch (e) { return; }
    for (const el of document.querySelectorAll("[data-live]")) {
      const key = el.dataset.live;
      if (Object.prototype.hasOwnProperty.call(v, key)) el.textContent = String(v[key]);
    }
  };
}

// Terminal escape sequences the text view cannot show (colours, cursor
// moves, titles) are dropped.
const ansi = /\x1b\[[0-?]*[ -\/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]|\r/g;

function terminal() {
  const box = document.getElementById("terminal");
  if (!box) return;
  const id = box.dataset.sandbox;
  const base = "/ui/sandboxes/" + encodeURIComponent(id) + "/terminal";
  const open = document.getElementById("term-open");
  const out = document.getElementById("term-out");
  const form = document.getElementById("term-form");
  const input = document.getElementById("term-in");
  let pid = "";

  const post = (url, body) => fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Warren-CSRF": csrf() },
    body: JSON.stringify(body),
  });
  const write = (s) => {
    out.textContent += s.replace(ansi, "");
    out.scrollTop = out.scrollHeight;
  };

  open.addEventListener("click", async () => {
    open.disabled = true;
    const res = await post(base, { Rows: 24, Cols: 100 });
    const j = await res.json().catch(() => ({}));
    if (!res.ok || !j.process_id) {
      write("cannot start a shell: " + (j.error || res.status) + "\n");
      out.hidden = false;
      open.disabled = false;
      return;
    }
    pid = j.process_id;
    out.hidden = false;
    form.hidden = false;
    open.hidden = true;
    input.focus();
    const es = new EventSource(base + "/" + encodeURIComponent(pid));
    es.onmessage = (ev) => {
      let v;
      try { v = JSON.parse(ev.data); } catch (e) { return; }
      if (typeof v.out === "string") write(v.out);
      if (typeof v.error === "string") { write("\n[" + v.error + "]\n"); es.close(); }
      if (typeof v.exit === "string") { write("\n[exited " + v.exit + "]\n"); es.close(); form.hidden = true; }
    };
  });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!pid) return;
    const line = input.value + "\n";
    input.value = "";
    const res = await post(base + "/" + encodeURIComponent(pid) + "/input", { data: line });
    if (!res.ok) write("[input refused: " + res.status + "]\n");
  });
}

document.addEventListener("DOMContentLoaded", () => { live(); terminal(); });
