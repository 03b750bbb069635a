// uPlot line charts that follow their panel's size.
import uPlot from "../vendor/uplot-1.6.32/uPlot.esm.js";

const AXIS = { stroke: "#8a96a3", grid: { stroke: "#2a333d" }, ticks: { stroke: "#2a333d" } };

export function lineChart(body, series) {
  const opts = {
    width: Math.max(body.clientWidth, 100), height: Math.max(body.clientHeight - 30, 60),
    scales: { x: { time: false } },
    axes: [AXIS, AXIS],
    legend: { show: true },
    cursor: { drag: { x: false, y: false } },
    series: [{ label: "step" }, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 1.5, points: { show: false } }))],
  };
  const empty = [[], ...series.map(() => [])];
  const plot = new uPlot(opts, empty, body);
  const ro = new ResizeObserver(() => plot.setSize({ width: Math.max(body.clientWidth, 100), height: Math.max(body.clientHeight - 30, 60) }));
  ro.observe(body);
  return {
    plot,
    set(data) { plot.setData(data); },
    destroy() { ro.disconnect(); plot.destroy(); },
  };
}
