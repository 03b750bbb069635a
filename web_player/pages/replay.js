// A recorded dataset episode: the player's scrubber over its frames (from the dataset's verified
// copy: recorded, or re-simulated from seed and actions), the recorded action with its meaning, raw
// and shaped rewards and returns per step, the events, and the episode's provenance.
// Step t shows the screen before action t and what that action brought (docs/ARCHITECTURE.md §12).
import { getJson } from "../net/api.js";
import { openReplay } from "../net/socket.js";
import { crumbs, encGoal, link, showError } from "../nav.js";
import { panelGrid, REPLAY_LAYOUT } from "../layout.js";
import { gamePanel } from "../panels/game.js";
import { actionsPanel } from "../panels/actions.js";
import { rewardPanel } from "../panels/reward.js";
import { eventsPanel } from "../panels/events.js";
import { scrubberPanel } from "../panels/scrubber.js";

const enc = encodeURIComponent;
const BATCH = 32;        // frames per request
const IN_FLIGHT = 2;     // frame requests outstanding while prefetching

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
  if (text) e.textContent = text;
  return e;
}

function kvRows(body, rows) {
  const kv = el("div", { class: "kv" });
  for (const [k, v, key] of rows) {
    const a = el("span", {}, k);
    const b = el("span", key ? { "data-key": key } : {}, v == null ? "–" : String(v));
    kv.append(a, b);
  }
  body.replaceChildren(kv);
}

const num = (v) => (Math.abs(v) >= 100 ? v.toFixed(1) : Number(v.toFixed(4)).toString());

export async function replayView(name, index) {
  const page = await getJson(`/datasets/${enc(name)}`);
  const project = page.project;
  crumbs([["projects", "/"], ...(project ? [[project, `/projects/${enc(project)}`],
    [page.goal_id, `/projects/${enc(project)}/goals/${encGoal(page.goal_id)}`]] : [[page.goal_id]]),
  [name, `/datasets/${enc(name)}`], [`episode ${index}`]]);
  const main = document.getElementById("main");
  main.append(el("h1", {}, `${name} · episode ${index} · ${page.goal_id}`));
  const bar = el("div", { class: "toolbar" });
  const play = el("button", { id: "play" }, "Play");
  const back = el("button", { id: "back" }, "◀ Step");
  const step1 = el("button", { id: "step1" }, "Step ▶");
  const fps = el("input", { id: "fps", type: "number", min: "1", max: "240", value: "30", "aria-label": "fps" });
  const status = el("span", { id: "status", class: "muted" }, "loading the episode…");
  bar.append(play, back, step1, el("span", {}, "fps"), fps);
  const indices = page.episodes.map((e) => e.index);
  const at = indices.indexOf(index);
  if (at > 0) bar.append(link(`◀ episode ${indices[at - 1]}`, `/datasets/${enc(name)}/episodes/${indices[at - 1]}`));
  if (at >= 0 && at + 1 < indices.length) bar.append(link(`episode ${indices[at + 1]} ▶`, `/datasets/${enc(name)}/episodes/${indices[at + 1]}`));
  bar.append(status);
  main.append(bar);

  const grid = panelGrid(main, { layout: REPLAY_LAYOUT, key: "gradlab.play.layout.replay" });
  const b = grid.bodies;
  const game = gamePanel(b.game);
  const note = el("p", { id: "frames-note", class: "muted" });
  note.hidden = true;
  b.game.prepend(note);
  const reward = rewardPanel(b.reward, { include: () => true });
  let actions = null, events = null;
  let steps = [];
  let view = 0;
  let playing = false;
  let timer = null;
  let requested = null;     // Uint8Array: frame t asked for
  let inFlight = 0;
  let batchEnds = new Set();
  let fill = 0;             // prefetch: the first frame not yet asked for
  let nFrames = 0;
  const state = { ready: false, view: 0, frames: 0, nFrames: 0, source: null, closed: false };
  window.gradlab = { state };

  const scrub = scrubberPanel(b.scrubber, {
    onScrub(i) { pause(); show(i); },
    onLive() { pause(); show(steps.length - 1); },
  });

  function ask(start) {
    let n = 0;
    while (start + n < nFrames && n < BATCH && !requested[start + n]) { requested[start + n] = 1; n += 1; }
    if (!n) return;
    inFlight += 1;
    batchEnds.add(start + n - 1);
    session.send({ type: "frames", start, n });
  }

  function prefetch() {
    while (inFlight < IN_FLIGHT) {
      while (fill < nFrames && requested[fill]) fill += 1;
      if (fill >= nFrames) return;
      ask(fill);
    }
  }

  function draw() {
    const s = steps[view];
    if (!s) return;
    state.view = view;
    game.show(s);
    if (actions) actions.show(s);
    const m = s.msg;
    kvRows(b.step, [
      ["step", `${m.t} of ${steps.length - 1}`, "t"],
      ["action", m.meaning != null ? `${m.action}: ${m.meaning}` : JSON.stringify(m.action), "action"],
      ["reward (raw)", num(m.reward_raw), "reward_raw"],
      ["reward (shaped)", num(m.reward_shaped), "reward_shaped"],
      ["return (shaped, so far)", num(m.episode_return), "return"],
      ["return (raw, so far)", num(m.episode_raw_return), "raw_return"],
      ["terminated / truncated", `${m.terminated} / ${m.truncated}`, "end"],
    ]);
    Object.assign(b.step.dataset, { t: String(m.t), action: JSON.stringify(m.action), rewardRaw: String(m.reward_raw),
      rewardShaped: String(m.reward_shaped), episodeReturn: String(m.episode_return) });
    scrub.show(steps, view, playing);
    reward.show(steps, view);
    if (events) events.show(steps, view);
  }

  function show(i) {
    view = Math.max(0, Math.min(i, steps.length - 1));
    if (nFrames && !steps[view].url && !requested[view]) ask(view);
    requestAnimationFrame(draw);
  }

  function pause() {
    playing = false;
    play.textContent = "Play";
    if (timer) { clearTimeout(timer); timer = null; }
    b.game.dataset.playing = "false";
  }

  function tick() {
    timer = null;
    if (!playing) return;
    if (view + 1 >= steps.length) { pause(); requestAnimationFrame(draw); return; }
    if (!nFrames || steps[view + 1].url) show(view + 1);
    else if (!requested[view + 1]) ask(view + 1);
    timer = setTimeout(tick, 1000 / Math.max(1, Number(fps.value) || 30));
  }

  const session = openReplay({ dataset: name, episode: index }, {
    message(msg) {
      if (msg.type === "ready") {
        const st = msg.steps;
        steps = st.actions.map((action, t) => ({
          url: null, obsUrl: null,
          msg: { t, seq: t, action, meaning: msg.action_meanings[action], reward_raw: st.raw_rewards[t],
            reward_shaped: st.rewards[t], episode_return: st.returns[t], episode_raw_return: st.raw_returns[t],
            terminated: st.terminated[t], truncated: st.truncated[t], events: st.events[t], signals: {}, obs: null },
        }));
        nFrames = msg.n_frames;
        requested = new Uint8Array(nFrames);
        actions = actionsPanel(b.actions, msg.action_meanings);
        events = eventsPanel(b.events, [], { emptyNote: msg.event_names.length
          ? `datasets record events, not signals; events of this goal: ${msg.event_names.join(", ")}; fired so far:`
          : "this goal's task program has no events (datasets record events, not signals)" });
        game.configure(msg.frames === "none" ? "no frames" : `${msg.frames} frames`, false);
        b.game.dataset.source = msg.frames;
        if (msg.frames_note) { note.textContent = msg.frames_note; note.hidden = false; }
        const p = msg.provenance;
        kvRows(b.episode, [
          ["agent", p.agent, "agent"], ["seed", p.seed, "seed"], ["start", p.start],
          ["outcome", `${p.outcome} (${p.reason})`, "outcome"], ["length", p.length, "length"],
          ["return (shaped / raw)", `${num(p.return)} / ${num(p.raw_return)}`, "episode_return"],
          ["replay", p.determinism], ["checkpoint", p.checkpoint_sha256 ? `${p.checkpoint_sha256.slice(0, 16)} (${p.publication || ""})` : null],
          ["dataset", `${msg.dataset} · sha256 ${msg.sha256.slice(0, 16)} · recorded ${p.created_at}`],
        ]);
        status.textContent = `${msg.env_id} · ${msg.episodes} episodes · frames: ${msg.frames} · worker pid ${msg.worker_pid}`;
        Object.assign(state, { ready: true, nFrames, source: msg.frames });
        prefetch();
        show(0);
      } else if (msg.type === "error") {
        showError(msg.message);
      }
    },
    frame(seq, t, blob) {
      const s = steps[t];
      if (s && !s.url) { s.url = URL.createObjectURL(blob); state.frames += 1; }
      if (batchEnds.delete(t)) { inFlight -= 1; prefetch(); }
      if (t === view) requestAnimationFrame(draw);
    },
    error(message) { showError(message); },
    closed(code, reason) {
      state.closed = true;
      if (code !== 1000 && code !== 1005 && !document.getElementById("error").textContent) {
        showError(`replay connection closed (${code}${reason ? `: ${reason}` : ""}); reload the page to play again`);
      }
    },
  });

  play.addEventListener("click", () => {
    if (playing) { pause(); return; }
    if (view + 1 >= steps.length) show(0);
    playing = true;
    play.textContent = "Pause";
    b.game.dataset.playing = "true";
    tick();
  });
  back.addEventListener("click", () => { pause(); show(view - 1); });
  step1.addEventListener("click", () => { pause(); show(view + 1); });

  return () => {
    pause();
    session.close();
    reward.destroy();
    grid.destroy();
    steps.forEach((s) => game.retire(s.url));
    steps = [];
  };
}
