// Rewards of the current episode: the provider's (raw), the task program's (shaped), and the
// cumulative shaped return; below the chart, one row per reward component (a named reward term,
// or native and each rewarded event): its value at the shown step and its sum over the episode so
// far, in task-reward units (before reward_scale and clipping).
import { lineChart } from "./chart.js";

// `include(msg)`: the steps drawn (default: those an action was taken in, not the reset; a recorded
// episode draws every step). An action program has no value, so its steps are told by their action.
export function rewardPanel(body, { include = (msg) => msg.action != null } = {}) {
  const chart = lineChart(body, [
    { label: "raw", color: "#ffb84f" },
    { label: "shaped", color: "#4fa3ff" },
    { label: "return (cumulative shaped)", color: "#5fd38d" },
  ]);
  const table = document.createElement("table");
  table.className = "reward-components";
  table.hidden = true;
  body.append(table);
  const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(3));
  return {
    show(steps, upto) {
      const s = steps.slice(0, upto + 1).filter((x) => include(x.msg));
      chart.set([s.map((x) => x.msg.t), s.map((x) => x.msg.reward_raw), s.map((x) => x.msg.reward_shaped),
        s.map((x) => x.msg.episode_return)]);
      body.dataset.points = String(s.length);
      const last = s.length ? s[s.length - 1].msg.reward_components || {} : {};
      const names = Object.keys(last);
      table.hidden = names.length === 0;
      if (names.length) body.dataset.components = names.join(",");
      const head = document.createElement("tr");
      for (const h of ["component", "step", "episode"]) {
        const th = document.createElement("th");
        th.textContent = h;
        head.append(th);
      }
      const rows = names.map((name) => {
        const tr = document.createElement("tr");
        tr.dataset.component = name;
        const total = s.reduce((acc, x) => acc + ((x.msg.reward_components || {})[name] || 0), 0);
        for (const text of [name, fmt(last[name]), fmt(total)]) {
          const td = document.createElement("td");
          td.textContent = text;
          tr.append(td);
        }
        return tr;
      });
      table.replaceChildren(head, ...rows);
    },
    destroy() { chart.destroy(); },
  };
}
