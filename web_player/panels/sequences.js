// A JERK checkpoint's retained sequences: their mean scores as bars (best first; the first is the
// checkpoint's own program) and every sequence in a sortable table. Clicking a bar or its "replay"
// button replays that sequence open loop; its replay pauses where the sequence ends.
import { dataTable } from "../table.js";
import { el, fmt, svgEl } from "../dom.js";

const BAR_PX = 14;
const CHART_H = 120;
const MAX_BARS = 100;

function bars(container, seqs, replaying, onReplay) {
  const shown = seqs.slice(0, MAX_BARS);
  if (!shown.length) return 0;
  const top = Math.max(...shown.map((q) => q.return_mean), 0);
  const bottom = Math.min(...shown.map((q) => q.return_mean), 0);
  const span = top - bottom || 1;
  const w = shown.length * BAR_PX;
  const svg = svgEl("svg", { width: w, height: CHART_H, viewBox: `0 0 ${w} ${CHART_H}`, role: "img",
    "aria-label": "retained sequences' mean scores, best first", id: "sequence-bars" });
  const zero = CHART_H * (top / span);
  shown.forEach((q, i) => {
    const y = CHART_H * ((top - Math.max(q.return_mean, 0)) / span);
    const h = Math.max(1, Math.abs(q.return_mean) / span * CHART_H);
    const r = svgEl("rect", {
      x: i * BAR_PX + 1, y: q.return_mean >= 0 ? y : zero, width: BAR_PX - 2, height: h,
      class: `sequence${q.rank === 1 ? " best" : ""}${q.key === replaying ? " replaying" : ""}`, "data-key": q.key,
    });
    const title = svgEl("title");
    title.textContent = `retained sequence ${q.rank}: mean score ${fmt(q.return_mean)} over ${q.replays} ` +
      `scoring${q.replays === 1 ? "" : "s"} · ${q.length} steps`;
    r.append(title);
    r.addEventListener("click", () => onReplay(q.rank === 1 ? null : q.key));
    svg.append(r);
  });
  const fig = el("figure", { class: "sequence-chart" });
  fig.append(svg, el("figcaption", { class: "muted" },
    `mean score per retained sequence, best first${seqs.length > shown.length ? ` (the ${shown.length} best of ${seqs.length})` : ""}`));
  container.append(fig);
  return shown.length;
}

export function sequencesPanel(container, page, { replaying, onReplay }) {
  const section = el("section", { id: "sequences", "data-sequences": String(page.sequence_count) });
  const best = page.sequences[0];
  section.append(el("h2", {}, `Retained sequences · ${page.sequence_count}` +
    (best ? ` · best: mean score ${fmt(best.return_mean)} in ${best.length} steps` : "")));
  section.append(el("p", { class: "muted" }, "What JERK keeps of an episode is its best prefix (up to where its " +
    "reward peaked); each replay scores it again, so a lucky sequence regresses to its mean. The best one " +
    "(green) is this checkpoint's own program. Click a sequence to replay it: the replay pauses where it ends."));
  section.dataset.bars = String(bars(section, page.sequences, replaying, onReplay));
  const scroll = el("div", { class: "archive-table" });
  section.append(scroll);
  dataTable(scroll, {
    searchLabel: "Search sequences",
    columns: [
      { key: "rank", label: "rank" },
      { key: "length", label: "steps" },
      { key: "replays", label: "scorings" },
      { key: "return_mean", label: "mean score", render: (q) => fmt(q.return_mean) },
      { key: "return_last", label: "last", render: (q) => fmt(q.return_last) },
      { key: "return_best", label: "best", render: (q) => fmt(q.return_best) },
      { key: "successes", label: "successes" },
      { key: "replay", label: "", value: () => "", render: (q) => {
        const b = el("button", { class: "replay-sequence", "data-key": q.key },
          q.key === replaying || (replaying == null && q.rank === 1) ? "playing" : "replay");
        b.addEventListener("click", () => onReplay(q.rank === 1 ? null : q.key));
        return b;
      } },
    ],
    rows: page.sequences,
  });
  container.append(section);
  return section;
}
