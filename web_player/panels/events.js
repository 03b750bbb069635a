// Signals (the task program's values after the step shown) and the events that fired this episode.
// `emptyNote`: what to say when there are no signals (default: the task program reads none).
export function eventsPanel(body, signalNames, { emptyNote = "this goal's task program reads no signals" } = {}) {
  const kv = document.createElement("div");
  kv.className = "kv";
  const list = document.createElement("ul");
  const wrap = document.createElement("div");
  wrap.className = "events";
  wrap.append(list);
  const none = document.createElement("p");
  none.className = "muted";
  none.textContent = signalNames.length ? "" : emptyNote;
  body.append(none, kv, wrap);
  return {
    show(steps, upto) {
      const step = steps[upto];
      if (!step) return;
      kv.replaceChildren(...Object.entries(step.msg.signals).flatMap(([k, v]) => {
        const a = document.createElement("span"); a.textContent = k;
        const b = document.createElement("span"); b.textContent = v == null ? "–" : String(v);
        return [a, b];
      }));
      const fired = steps.slice(0, upto + 1).flatMap((s) => s.msg.events.map((e) => [s.msg.t, e]));
      list.replaceChildren(...fired.slice(-100).map(([t, e]) => {
        const li = document.createElement("li"); li.textContent = `t=${t} ${e}`; return li;
      }));
      body.dataset.events = String(fired.length);
    },
  };
}
