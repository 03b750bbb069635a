// A search checkpoint's archive: signal cells on a grid (the first two cell signals as x and y, one
// grid per value of the others), shaded by visits, or frame cells as their pictures; the best
// lineage outlined; every cell in a sortable table. Clicking a cell or its "replay" button replays the program that reached it.
import { dataTable } from "../table.js";
import { el, fmt, svgEl } from "../dom.js";

const CELL_PX = 26;
const MAX_TABLE_ROWS = 500;
const MAX_SPAN = 200; // bins a grid side may have (a wider archive is listed, not drawn)

// One grid per combination of the coordinates past the first two (e.g. has_key=0, has_key=1).
function grids(container, page, replaying, onReplay) {
  const [xs, ys, ...rest] = page.coordinates;
  const placed = page.cells.filter((c) => c.coordinates);
  if (!placed.length || !xs) return 0;
  const yName = ys || null;
  const facet = (c) => rest.map((n) => `${n}=${c.coordinates[n]}`).join(" ") || "all cells";
  const facets = new Map();
  placed.forEach((c) => { const k = facet(c); if (!facets.has(k)) facets.set(k, []); facets.get(k).push(c); });
  const xv = placed.map((c) => c.coordinates[xs]);
  const yv = placed.map((c) => (yName ? c.coordinates[yName] : 0));
  const x0 = Math.min(...xv), x1 = Math.max(...xv), y0 = Math.min(...yv), y1 = Math.max(...yv);
  if (x1 - x0 >= MAX_SPAN || y1 - y0 >= MAX_SPAN) {  // too spread to draw cell by cell: the table lists them
    container.append(el("p", { class: "muted", id: "archive-too-wide" },
      `The cells span ${x1 - x0 + 1} × ${y1 - y0 + 1} bins, too many to draw (at most ${MAX_SPAN} a side): the table lists them.`));
    return 0;
  }
  const w = (x1 - x0 + 1) * CELL_PX, h = (y1 - y0 + 1) * CELL_PX;
  const maxVisits = Math.max(1, ...placed.map((c) => c.visits));
  const best = page.best ? page.best.cell : null;
  const row = el("div", { class: "archive-grids" });
  [...facets.keys()].sort().forEach((name) => {
    const fig = el("figure", { class: "archive-grid", "data-facet": name });
    const svg = svgEl("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img",
      "aria-label": `archive cells, ${xs} across${yName ? `, ${yName} down` : ""}, ${name}` });
    facets.get(name).forEach((c) => {
      const shade = Math.log1p(c.visits) / Math.log1p(maxVisits);
      const r = svgEl("rect", {
        x: (c.coordinates[xs] - x0) * CELL_PX + 1, y: ((yName ? c.coordinates[yName] : 0) - y0) * CELL_PX + 1,
        width: CELL_PX - 2, height: CELL_PX - 2, rx: 2,
        fill: `rgba(79, 163, 255, ${(0.2 + 0.8 * shade).toFixed(3)})`,
        class: `cell${c.lineage ? " lineage" : ""}${c.key === best ? " best" : ""}${c.key === replaying ? " replaying" : ""}`,
        "data-key": c.key,
      });
      const title = svgEl("title");
      title.textContent = `${c.key}\nreturn ${fmt(c.return)} in ${c.length} steps · progress ${fmt(c.progress)}\n` +
        `visits ${c.visits} · selections ${c.selections}${c.lineage ? " · best lineage" : ""}`;
      r.append(title);
      r.addEventListener("click", () => onReplay(c.key));
      svg.append(r);
    });
    const cap = el("figcaption", { class: "muted" }, `${name} · ${facets.get(name).length} cells`);
    fig.append(svg, cap);
    row.append(fig);
  });
  container.append(row);
  return placed.length;
}

// Frame cells: each cell's picture (the downscaled frame whose hash is its key), best first.
const THUMB_SCALE = 6;
const MAX_THUMBS = 400;

function thumbnails(container, page, replaying, onReplay) {
  const size = page.thumbnail_size;
  const drawn = page.cells.filter((c) => c.thumbnail).slice(0, MAX_THUMBS);
  if (!size || !drawn.length) return 0;
  const [w, h, levels] = size;
  const digits = levels <= 16 ? 1 : 2;
  const best = page.best ? page.best.cell : null;
  const grid = el("div", { class: "archive-thumbs", role: "list", "aria-label": "frame cells, best first" });
  drawn.forEach((c) => {
    const canvas = el("canvas", {
      width: String(w), height: String(h), role: "listitem", "data-key": c.key,
      class: `thumb${c.lineage ? " lineage" : ""}${c.key === best ? " best" : ""}${c.key === replaying ? " replaying" : ""}`,
    });
    canvas.style.width = `${w * THUMB_SCALE}px`;
    canvas.style.height = `${h * THUMB_SCALE}px`;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(w, h);
    for (let i = 0; i < w * h; i++) {
      const grey = Math.round((parseInt(c.thumbnail.substr(i * digits, digits), 16) * 255) / (levels - 1));
      img.data.set([grey, grey, grey, 255], i * 4);
    }
    ctx.putImageData(img, 0, 0);
    canvas.title = `${c.key}\nreturn ${fmt(c.return)} in ${c.length} steps · progress ${fmt(c.progress)}\n` +
      `visits ${c.visits} · selections ${c.selections}${c.lineage ? " · best lineage" : ""}`;
    canvas.addEventListener("click", () => onReplay(c.key));
    grid.append(canvas);
  });
  const withPicture = page.cells.filter((c) => c.thumbnail).length;
  if (withPicture > drawn.length) {
    container.append(el("p", { class: "muted" }, `The pictures of the ${drawn.length} best of ${withPicture} cells (by return, then progress).`));
  }
  container.append(grid);
  return drawn.length;
}

export function archivePanel(container, page, { replaying, onReplay }) {
  const section = el("section", { id: "archive", "data-cells": String(page.cell_count) });
  const best = page.best
    ? `best: return ${fmt(page.best.return)} in ${page.best.length} steps (lineage of ${page.lineage.length} cells)`
    : "no successful trajectory yet";
  section.append(el("h2", {}, `Archive · ${page.cell_count} cells · ${page.visit_count} visits · ` +
    `${page.selection_count} selections · ${best}`));
  const note = page.cell_kind === "frame"
    ? (page.cells.some((c) => c.thumbnail)
      ? `Each frame cell as its downscaled frame (${page.thumbnail_size[0]} × ${page.thumbnail_size[1]} pixels, ` +
        `${page.thumbnail_size[2]} grey levels). Outlined: the best lineage. Click a cell to replay the program that reached it.`
      : "Frame cells (downscaled frames) have no coordinates, and this archive keeps no pictures: the table lists them.")
    : `Shade: visits (log). Outlined: the best lineage. ${page.coordinates[0]} across` +
      `${page.coordinates[1] ? `, ${page.coordinates[1]} down` : ""}. Click a cell to replay the program that reached it.`;
  section.append(el("p", { class: "muted" }, note));
  if (page.best) {
    // The best trajectory ends in success (an episode end, so no cell): it is the checkpoint's own program.
    const p = el("p", { id: "best-program" });
    p.append(document.createTextNode(`The best trajectory (return ${fmt(page.best.return)} in ${page.best.length} steps) ` +
      "is this checkpoint's own program: "));
    const a = el("a", { href: "#", id: "play-best" }, replaying ? "play it" : "it is playing");
    a.addEventListener("click", (ev) => { ev.preventDefault(); onReplay(null); });
    p.append(a, document.createTextNode(". Green outline: the cell its last exploration started from."));
    section.append(p);
  }
  section.append(el("p", { class: "muted" }, "A cell's replay (red outline) pauses where its program ends; " +
    "steps after that take action 0."));
  section.dataset.placed = String(grids(section, page, replaying, onReplay));
  section.dataset.thumbnails = String(thumbnails(section, page, replaying, onReplay));
  const rows = page.cells.slice(0, MAX_TABLE_ROWS);
  if (page.cells.length > rows.length || page.cells_left_out) {
    section.append(el("p", { class: "muted" },
      `The table lists the ${rows.length} best of ${page.cell_count} cells (by return, then progress).`));
  }
  const scroll = el("div", { class: "archive-table" });
  section.append(scroll);
  dataTable(scroll, {
    searchLabel: "Search cells",
    columns: [
      { key: "key", label: "cell" },
      { key: "return", label: "return", value: (c) => c.return, render: (c) => fmt(c.return) },
      { key: "length", label: "steps" },
      { key: "progress", label: "progress", value: (c) => c.progress, render: (c) => fmt(c.progress) },
      { key: "visits", label: "visits" },
      { key: "selections", label: "selections" },
      { key: "lineage", label: "lineage", value: (c) => (c.lineage ? "yes" : "") },
      { key: "replay", label: "", value: () => "", render: (c) => {
        const b = el("button", { class: "replay-cell", "data-key": c.key }, "replay");
        b.addEventListener("click", () => onReplay(c.key));
        return b;
      } },
    ],
    rows,
  });
  container.append(section);
  return section;
}
