// Play a goal yourself: the key map (from the server), the keyboard, the game and the episode report.
// The page sends the keys held; the server maps them to an action and steps (docs/ARCHITECTURE.md §12).
// ?dataset=NAME&episodes=N records the episodes into a new dataset (what `gradlab dataset record
// --agent human` opens); ?frames=0 leaves the rendered frames out.
import { openHuman } from "../net/socket.js";
import { crumbs, showError } from "../nav.js";
import { gamePanel } from "../panels/game.js";
import { episodePanel } from "../panels/episode.js";

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
  if (text) e.textContent = text;
  return e;
}

function panel(parent, id, title) {
  const box = el("section", { class: "human-panel" });
  const head = el("div", { class: "panel-head" }, title);
  const body = el("div", { class: "panel-body", id: `panel-${id}` });
  box.append(head, body);
  parent.append(box);
  return body;
}

const MAX_LOG = 200;

export async function humanView(goal) {
  crumbs([["projects", "/"], [`${goal} · play yourself`]]);
  const params = new URLSearchParams(location.search);
  const dataset = params.get("dataset");
  const episodes = Number(params.get("episodes") || "1");
  const main = document.getElementById("main");
  main.append(el("h1", {}, `Play ${goal} yourself`));
  const status = el("p", { id: "human-status", class: "muted" }, "starting…");
  const recording = el("p", { id: "recording" });
  recording.hidden = !dataset;
  main.append(status, recording);
  const grid = el("div", { class: "human" });
  main.append(grid);
  const game = gamePanel(panel(grid, "game", "Game"));
  const keysBody = panel(grid, "keys", "Keys");
  const episodeBody = panel(grid, "episode", "Episode report");
  const episode = episodePanel(episodeBody);
  const logBody = panel(grid, "log", "Your actions");
  const log = el("ol", { class: "human-log", reversed: "" });
  logBody.append(log);

  let meanings = [];
  let bound = new Set();     // the keys the map uses (others are left to the browser)
  let held = [];             // keys held now, in press order
  let mode = "turn";
  let current = null;        // the step shown
  let previous = null;       // the step whose frame was shown before (its URLs retired at the next frame)
  const state = { ready: false, seq: 0, actions: [], landed: 0, published: null };
  window.gradlab = { state };

  function showRecording(rec) {
    if (!rec) return;
    state.landed = rec.landed;
    state.published = rec.published;
    recording.dataset.landed = String(rec.landed);
    recording.dataset.published = rec.published ? "true" : "false";
    recording.textContent = rec.published
      ? `dataset ${rec.dataset} stored: ${rec.landed} episode${rec.landed === 1 ? "" : "s"} (sha256 ${rec.published.slice(0, 12)}); you can close this tab`
      : `recording into dataset ${rec.dataset}: ${rec.landed} of ${rec.episodes} episodes landed`;
  }

  function keyTable(rows) {
    const table = el("table", { class: "data keymap" });
    const head = table.createTHead().insertRow();
    ["keys", "action"].forEach((h) => head.append(el("th", {}, h)));
    const tbody = table.createTBody();
    for (const r of rows) {
      const tr = tbody.insertRow();
      tr.dataset.action = String(r.action);
      tr.insertCell().textContent = r.labels.length ? r.labels.join(" or ") : "–";
      tr.insertCell().textContent = `${r.action}: ${r.meaning}${r.noop ? " (no key held)" : ""}`;
      r.keys.forEach((k) => bound.add(k));
      if (r.action < 10) bound.add(String(r.action));
    }
    keysBody.replaceChildren(table);
  }

  const session = openHuman({ goal, dataset, episodes, frames: params.get("frames") !== "0",
    seed: params.has("seed") ? Number(params.get("seed")) : null, fps: params.has("fps") ? Number(params.get("fps")) : null }, {
    message(msg) {
      if (msg.type === "ready") {
        meanings = msg.action_meanings;
        mode = msg.mode;
        keyTable(msg.keymap);
        game.configure(msg.screen, true);
        state.ready = true;
        status.dataset.mode = mode;
        status.textContent = mode === "realtime"
          ? `${msg.env_id} · real time at ${msg.fps} steps/s: hold keys to act; no key held is ${meanings[msg.noop]}`
          : `${msg.env_id} · turn by turn: each key press is one step`;
        showRecording(msg.recording);
      } else if (msg.type === "step") {
        current = { msg, url: null, obsUrl: null };
        if (msg.action != null) {
          state.actions.push(msg.action);
          const li = el("li", {}, `${meanings[msg.action] ?? msg.action} → reward ${msg.reward_shaped.toFixed(2)}`);
          log.prepend(li);
          while (log.children.length > MAX_LOG) log.lastChild.remove();
        }
        episode.live(current);
        if (msg.episode) {
          episode.finished(msg.episode);
          showRecording(msg.episode.recording);
        }
      } else if (msg.type === "error") {
        showError(msg.message);
      }
    },
    observation(seq, blob) { if (current && current.msg.seq === seq) current.obsUrl = URL.createObjectURL(blob); },
    frame(seq, t, blob) {
      if (!current || current.msg.seq !== seq) return;
      if (previous) game.retire(previous.url, previous.obsUrl);
      current.url = URL.createObjectURL(blob);
      game.show(current);
      previous = current;
      state.seq = seq;
    },
    error(message) { showError(message); },
    closed(code, reason) {
      if (code !== 1000 && code !== 1005 && !document.getElementById("error").textContent) {
        showError(`play connection closed (${code}${reason ? `: ${reason}` : ""}); reload the page to play again`);
      }
    },
  });

  const send = (press) => session.send({ type: "keys", held, press });
  const onDown = (ev) => {
    if (!bound.has(ev.key) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    ev.preventDefault(); // arrows and Space would scroll the page
    if (ev.repeat && mode === "realtime") return; // held already
    if (!held.includes(ev.key)) held = [...held, ev.key];
    send(true);
  };
  const onUp = (ev) => {
    if (!held.includes(ev.key)) return;
    held = held.filter((k) => k !== ev.key);
    if (mode === "realtime") send(false);
  };
  const onBlur = () => { held = []; if (mode === "realtime") send(false); };
  window.addEventListener("keydown", onDown);
  window.addEventListener("keyup", onUp);
  window.addEventListener("blur", onBlur);

  return () => {
    window.removeEventListener("keydown", onDown);
    window.removeEventListener("keyup", onUp);
    window.removeEventListener("blur", onBlur);
    session.close();
  };
}
