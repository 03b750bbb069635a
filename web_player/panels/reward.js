// Rewards of the current episode: the provider's (raw), the task program's (shaped), and the
// cumulative shaped return.
import { lineChart } from "./chart.js";

export function rewardPanel(body) {
  const chart = lineChart(body, [
    { label: "raw", color: "#ffb84f" },
    { label: "shaped", color: "#4fa3ff" },
    { label: "return (cumulative shaped)", color: "#5fd38d" },
  ]);
  return {
    show(steps, upto) {
      const s = steps.slice(0, upto + 1).filter((x) => x.msg.value_acted != null);
      chart.set([s.map((x) => x.msg.t), s.map((x) => x.msg.reward_raw), s.map((x) => x.msg.reward_shaped),
        s.map((x) => x.msg.episode_return)]);
      body.dataset.points = String(s.length);
    },
    destroy() { chart.destroy(); },
  };
}
