// Value vs return-to-go: V(s_t) of the current episode live; for the last finished episode, V(s_t)
// beside the realized discounted return-to-go (the recipe's gamma; bootstrapped on truncation only).
import { lineChart } from "./chart.js";

export function valuePanel(body) {
  const chart = lineChart(body, [
    { label: "V(s) now", color: "#4fa3ff" },
    { label: "V(s) last episode", color: "#8a96a3" },
    { label: "return-to-go last episode", color: "#5fd38d" },
  ]);
  let last = null;
  return {
    finished(episode) { last = episode; },
    show(steps, upto) {
      const cur = steps.slice(0, upto + 1).filter((s) => s.msg.value_acted != null).map((s) => s.msg.value_acted);
      const lastV = last ? last.values : [];
      const lastG = last ? last.returns_to_go : [];
      const n = Math.max(cur.length, lastV.length);
      const x = Array.from({ length: n }, (_, i) => i);
      const pad = (a) => x.map((i) => (i < a.length ? a[i] : null));
      chart.set([x, pad(cur), pad(lastV), pad(lastG)]);
      body.dataset.points = String(cur.length);
      body.dataset.rtgPoints = String(lastG.length);
    },
    destroy() { chart.destroy(); },
  };
}
