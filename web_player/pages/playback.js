// The playback page: controls, the WebSocket session and every panel.
import { getJson, pageUrl, token } from "../net/api.js";
import { openPlayback } from "../net/socket.js";
import { crumbs, encGoal, link, showError } from "../nav.js";
import { panelGrid } from "../layout.js";
import { gamePanel } from "../panels/game.js";
import { actionsPanel } from "../panels/actions.js";
import { valuePanel } from "../panels/value.js";
import { rewardPanel } from "../panels/reward.js";
import { eventsPanel } from "../panels/events.js";
import { episodePanel } from "../panels/episode.js";
import { scrubberPanel } from "../panels/scrubber.js";
import { archivePanel } from "../panels/archive.js";
import { sequencesPanel } from "../panels/sequences.js";

const SEQUENCE_PREFIX = "sequence:"; // a JERK checkpoint's retained sequence, replayed like a cell (gradlab.play.archive)

const enc = encodeURIComponent;
const MAX_RETAINED = 5000;
// Charts and the events list redraw at most this often while playing (the game frame, the action
// bars and the scrubber follow every animation frame); paused or scrubbing, every change redraws.
const CHART_INTERVAL_MS = 100;

function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
  if (text) e.textContent = text;
  return e;
}

export async function playbackView(run, step) {
  const page = await getJson(`/runs/${enc(run)}/checkpoints/${step}`);
  const project = page.project;
  crumbs([["projects", "/"], ...(project ? [[project, `/projects/${enc(project)}`],
    [page.goal_id, `/projects/${enc(project)}/goals/${encGoal(page.goal_id)}`]] : []), [run, `/runs/${enc(run)}`], [`step ${step}`]]);
  const main = document.getElementById("main");
  const title = el("h1", {}, `${page.goal_id}/${page.recipe_id} · step ${step}${page.promoted ? " ★ promoted" : ""}`);
  main.append(title);
  if (page.error) {
    showError(`this checkpoint cannot be played: ${page.error}`);
    return null;
  }
  const params = new URLSearchParams(location.search);
  const bar = el("div", { class: "toolbar" });
  const play = el("button", { id: "play" }, "Pause");
  const step1 = el("button", { id: "step1" }, "Step");
  const stepN = el("input", { id: "step-n", type: "number", min: "1", value: "5", "aria-label": "steps" });
  const stepNBtn = el("button", { id: "stepN" }, "Step N");
  const seed = el("input", { id: "seed", type: "number", min: "0", value: params.get("seed") || "", "aria-label": "seed" });
  const reset = el("button", { id: "reset" }, "Reset");
  const fps = el("input", { id: "fps", type: "number", min: "0", max: "1000", value: params.get("fps") || "", "aria-label": "fps" });
  const detLabel = el("label");
  const det = el("input", { id: "deterministic", type: "checkbox" });
  det.checked = params.get("mode") !== "stochastic";
  const num = (input) => (input.value === "" ? null : Number(input.value));
  detLabel.append(det, document.createTextNode(" deterministic"));
  const obsLabel = el("label");
  const obsBox = el("input", { id: "observation", type: "checkbox" });
  obsBox.checked = params.get("observation") !== "off";
  obsLabel.append(obsBox, document.createTextNode(" agent's view"));
  const video = el("button", { id: "video", title: "Record one episode from this seed as MP4" }, "Record MP4");
  const status = el("span", { id: "status", class: "muted" });
  bar.append(play, step1, stepN, stepNBtn, el("span", {}, "seed"), seed, reset, el("span", {}, "fps"), fps, detLabel, obsLabel);
  if (page.previous_step != null) bar.append(link(`◀ step ${page.previous_step}`, `/runs/${enc(run)}/checkpoints/${page.previous_step}`));
  if (page.next_step != null) bar.append(link(`step ${page.next_step} ▶`, `/runs/${enc(run)}/checkpoints/${page.next_step}`));
  bar.append(video, status);
  main.append(bar);

  const grid = panelGrid(main);
  const b = grid.bodies;
  const cell = params.get("cell");
  if (page.archive || page.sequences) {
    // A search checkpoint: its archive (Go-Explore) or retained sequences (JERK) below the panels,
    // fetched beside playback (one that cannot be read says so there and stops nothing else); a
    // cell's or sequence's replay is this page with ?cell=KEY.
    const holder = el("div", { id: "archive-holder" });
    main.append(holder);
    const [what, panel] = page.archive ? ["archive", archivePanel] : ["sequences", sequencesPanel];
    getJson(`/runs/${enc(run)}/checkpoints/${step}/${what}`).then((data) => {
      panel(holder, data, {
        replaying: cell,
        onReplay(key) {  // null: the checkpoint's own program
          const query = key == null ? "" : `?cell=${enc(key)}`;
          history.pushState(null, "", pageUrl(`/runs/${enc(run)}/checkpoints/${step}${query}`));
          window.dispatchEvent(new PopStateEvent("popstate"));
        },
      });
    }).catch((e) => {
      holder.append(el("p", { id: "archive-error", class: "warning" }, `${what} unavailable: ${e.message || e}`));
    });
  }
  const game = gamePanel(b.game);
  const episode = episodePanel(b.episode);
  const value = valuePanel(b.value);
  const reward = rewardPanel(b.reward);
  let actions = null, events = null;

  let steps = [];            // the current episode's retained steps: {msg, url}
  let pending = new Map();   // seq → step waiting for its frame
  let view = -1;             // index shown while scrubbing; -1 = live
  let playing = true;
  let dirty = false;
  let info = null;
  const state = { frames: 0, workerPid: null, lastSeq: 0, ready: false, closed: false };
  window.gradlab = { state };

  const scrub = scrubberPanel(b.scrubber, {
    onScrub(i) { if (playing) session.send({ type: "pause" }); view = i; schedule(); },
    onLive() { view = -1; schedule(); },
  });

  function newEpisode() {
    steps.forEach((s) => game.retire(s.url, s.obsUrl));
    steps = [];
    view = -1;
  }

  function schedule() {
    if (dirty) return;
    dirty = true;
    requestAnimationFrame(draw);
  }

  let chartsAt = 0;
  let chartTimer = null;

  function draw() {
    dirty = false;
    if (!steps.length) return;
    let idx = view >= 0 ? Math.min(view, steps.length - 1) : steps.length - 1;
    if (view < 0) while (idx > 0 && !steps[idx].url) idx -= 1; // newest step whose frame arrived
    const s = steps[idx];
    const live = view < 0;
    // The scrubber moves when the frame is on screen, never before or behind it (a range and a label: cheap).
    if (!game.show(s, () => scrub.show(steps, idx, live))) scrub.show(steps, idx, live);
    if (actions) actions.show(s);
    episode.live(s);
    const now = performance.now();
    if (playing && view < 0 && now - chartsAt < CHART_INTERVAL_MS) {
      if (!chartTimer) chartTimer = setTimeout(() => { chartTimer = null; schedule(); }, CHART_INTERVAL_MS);
      return;
    }
    chartsAt = now;
    if (events) events.show(steps, idx);
    value.show(steps, idx);
    reward.show(steps, idx);
  }

  const session = openPlayback({
    runId: run, step, seed: num(seed), deterministic: params.has("mode") ? det.checked : null, fps: num(fps), cell,
  }, {
    message(msg) {
      if (msg.type === "ready") {
        info = msg;
        state.ready = true;
        state.workerPid = msg.worker_pid;
        actions = actionsPanel(b.actions, msg.action_meanings);
        game.configure(msg.screen, obsBox.checked);
        events = eventsPanel(b.events, msg.signals);
        seed.value = String(msg.seed);
        fps.value = String(msg.fps);
        det.checked = msg.deterministic;
        const sequence = msg.program && msg.program.cell && msg.program.cell.startsWith(SEQUENCE_PREFIX)
          ? msg.program.cell.slice(SEQUENCE_PREFIX.length) : null;
        if (msg.program && msg.program.cell) {  // said once the worker has the cell's program, not from the URL
          const note = el("p", { id: "replaying" }, sequence != null
            ? `Replaying retained sequence ${sequence}.` : `Replaying the program that reached cell ${msg.program.cell}.`);
          main.insertBefore(note, document.getElementById("archive-holder"));
        }
        const target = !msg.program || !msg.program.cell ? ""
          : sequence != null ? `: retained sequence ${sequence}` : ` to cell ${msg.program.cell}`;
        const program = msg.program ? ` · action program of ${msg.program.length} steps${target} (no value function)` : "";
        status.textContent = `${msg.env_id} · sha256 ${msg.checkpoint_sha256.slice(0, 12)} · γ ${msg.gamma}${program} · worker pid ${msg.worker_pid}`;
      } else if (msg.type === "step") {
        const last = steps[steps.length - 1];
        if (msg.t === 0 || (last && last.msg.episode) || steps.length >= MAX_RETAINED) newEpisode();
        const s = { msg, url: null, obsUrl: null };
        steps.push(s);
        pending.set(msg.seq, s);
        state.lastSeq = msg.seq;
        if (msg.episode) { episode.finished(msg.episode); value.finished(msg.episode); }
        // A cell's replay pauses where its program ends: the cell is reached there.
        if (info && info.program && info.program.cell && msg.t === info.program.length && playing && !msg.episode) {
          session.send({ type: "pause" });
          state.reachedCell = msg.signals;
        }
      } else if (msg.type === "state") {
        playing = msg.playing;
        play.textContent = playing ? "Pause" : "Play";
        b.game.dataset.playing = String(playing);
      } else if (msg.type === "error") {
        showError(msg.message);
        // Nothing plays after a refused start (an unknown cell, a checkpoint that does not verify).
        [play, step1, stepNBtn, reset, video].forEach((b) => { b.disabled = true; });
      }
    },
    observation(seq, blob) {
      const s = pending.get(seq);
      if (s && steps.includes(s)) s.obsUrl = URL.createObjectURL(blob);
    },
    frame(seq, t, blob) {
      const s = pending.get(seq);
      pending.delete(seq);
      if (!s) return;
      if (steps.includes(s)) s.url = URL.createObjectURL(blob);
      state.frames += 1;
      schedule();
    },
    error(message) { showError(message); },
    closed(code, reason) {
      state.closed = true;
      if (code !== 1000 && code !== 1005 && !document.getElementById("error").textContent) {
        showError(`playback connection closed (${code}${reason ? `: ${reason}` : ""}); reload the page to play again`);
      }
    },
  });

  video.addEventListener("click", async () => {
    video.disabled = true;
    video.textContent = "Recording…";
    try {
      const q = new URLSearchParams({ episodes: "1", seed: seed.value || "0", deterministic: String(det.checked) });
      const res = await fetch(`/api/runs/${enc(run)}/checkpoints/${step}/video?${q}`, { headers: { "X-Gradlab-Token": token() } });
      if (!res.ok) throw new Error((await res.json()).detail || res.statusText);
      const a = document.createElement("a");
      a.href = URL.createObjectURL(await res.blob());
      a.download = `${run}-${step}-seed${q.get("seed")}.mp4`;
      document.body.append(a);
      a.click();
      a.remove();
    } catch (e) {
      showError(`recording failed: ${e.message}`);
    } finally {
      video.disabled = false;
      video.textContent = "Record MP4";
    }
  });
  play.addEventListener("click", () => { view = -1; session.send({ type: playing ? "pause" : "play" }); });
  step1.addEventListener("click", () => { view = -1; session.send({ type: "step", n: 1 }); });
  stepNBtn.addEventListener("click", () => { view = -1; session.send({ type: "step", n: Math.max(1, Number(stepN.value) || 1) }); });
  reset.addEventListener("click", () => { view = -1; session.send({ type: "reset", seed: Math.max(0, Number(seed.value) || 0) }); });
  fps.addEventListener("change", () => session.send({ type: "fps", fps: Math.max(0, Number(fps.value) || 0) }));
  det.addEventListener("change", () => session.send({ type: "mode", deterministic: det.checked }));
  obsBox.addEventListener("change", () => game.showObservation(obsBox.checked));

  return () => {
    session.close();
    value.destroy();
    reward.destroy();
    grid.destroy();
    newEpisode();
    if (info) info = null;
  };
}
