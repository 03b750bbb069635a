// The playback and human-play WebSockets: hello with the token first, then JSON telemetry and binary frames.
import { PROTOCOL, token } from "./api.js";

const MAGIC = 0x31464c47; // "GLF1" little-endian: the screen frame of a step
const OBS_MAGIC = 0x314f4c47; // "GLO1": the agent's observation image of the same step (sent first)

function open(path, hello, handlers) {
  const ws = new WebSocket(`ws://${location.host}${path}`);
  ws.binaryType = "arraybuffer";
  ws.onopen = () => {
    ws.send(JSON.stringify({ type: "hello", protocol: PROTOCOL, token: token(), ...hello }));
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") {
      const msg = JSON.parse(ev.data);
      if (msg.type === "ready" && msg.protocol !== PROTOCOL) {
        handlers.error(`protocol mismatch: the server speaks ${msg.protocol}, this page ${PROTOCOL}; reload the page`);
        ws.close();
        return;
      }
      handlers.message(msg);
      return;
    }
    const view = new DataView(ev.data);
    if (ev.data.byteLength < 12) return;
    const magic = view.getUint32(0, true);
    const blob = new Blob([ev.data.slice(12)], { type: "image/jpeg" });
    if (magic === MAGIC) handlers.frame(view.getUint32(4, true), view.getUint32(8, true), blob);
    else if (magic === OBS_MAGIC && handlers.observation) handlers.observation(view.getUint32(4, true), blob);
  };
  ws.onclose = (ev) => handlers.closed(ev.code, ev.reason);
  return {
    send(cmd) { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(cmd)); },
    close() { ws.close(); },
  };
}

export function openPlayback({ runId, step, seed, deterministic, fps, cell }, handlers) {
  return open("/api/play", { run_id: runId, step, seed, deterministic, fps, ...(cell ? { cell } : {}) }, handlers);
}

// A recorded episode of a dataset: its steps in the ready message, then frames on request ({type: "frames"}).
export function openReplay({ dataset, episode }, handlers) {
  return open("/api/replay", { dataset, episode }, handlers);
}

// A person plays `goal`; with `dataset`, its `episodes` are recorded into that new dataset.
export function openHuman({ goal, dataset, episodes, frames, seed, fps }, handlers) {
  return open("/api/human", { goal_id: goal, dataset, episodes, frames, seed, fps }, handlers);
}
