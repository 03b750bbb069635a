// The panel grid (GridStack, vendored): panels can be moved and resized; the layout is kept in
// localStorage per page kind, versioned, so a changed default replaces an old saved layout.
const KEY = "gradlab.play.layout";
const VERSION = 1;

export const DEFAULT_LAYOUT = [
  { id: "game", title: "Game", x: 0, y: 0, w: 5, h: 5 },
  { id: "actions", title: "Action distribution", x: 5, y: 0, w: 3, h: 3 },
  { id: "episode", title: "Episode report", x: 8, y: 0, w: 4, h: 3 },
  { id: "value", title: "Value vs return-to-go", x: 5, y: 3, w: 7, h: 3 },
  { id: "reward", title: "Reward", x: 0, y: 5, w: 5, h: 3 },
  { id: "events", title: "Signals and events", x: 5, y: 6, w: 7, h: 2 },
  { id: "scrubber", title: "Scrubber", x: 0, y: 8, w: 12, h: 1 },
];

// A recorded episode (pages/replay.js): no policy, so no value panel; the step readout instead.
export const REPLAY_LAYOUT = [
  { id: "game", title: "Game", x: 0, y: 0, w: 5, h: 5 },
  { id: "actions", title: "Recorded action", x: 5, y: 0, w: 3, h: 3 },
  { id: "step", title: "Step", x: 8, y: 0, w: 4, h: 3 },
  { id: "episode", title: "Provenance", x: 5, y: 3, w: 7, h: 3 },
  { id: "reward", title: "Reward", x: 0, y: 5, w: 5, h: 3 },
  { id: "events", title: "Events", x: 5, y: 6, w: 7, h: 2 },
  { id: "scrubber", title: "Scrubber", x: 0, y: 8, w: 12, h: 1 },
];

function saved(key) {
  try {
    const doc = JSON.parse(localStorage.getItem(key) || "null");
    return doc && doc.version === VERSION && Array.isArray(doc.items) ? doc.items : null;
  } catch { return null; }
}

// Build the grid in `container` (`layout`: the panels, `key`: where their positions are kept);
// returns {bodies: id → panel body element, destroy()}.
export function panelGrid(container, { layout = DEFAULT_LAYOUT, key = KEY } = {}) {
  const grid = document.createElement("div");
  grid.className = "grid-stack";
  container.append(grid);
  const positions = Object.fromEntries((saved(key) || []).map((p) => [p.id, p]));
  const bodies = {};
  for (const panel of layout) {
    const pos = { ...panel, ...(positions[panel.id] || {}) };
    const item = document.createElement("div");
    item.className = "grid-stack-item";
    item.setAttribute("gs-id", panel.id);
    for (const k of ["x", "y", "w", "h"]) item.setAttribute(`gs-${k}`, String(pos[k]));
    const content = document.createElement("div");
    content.className = "grid-stack-item-content";
    const head = document.createElement("div");
    head.className = "panel-head";
    head.textContent = panel.title;
    const body = document.createElement("div");
    body.className = "panel-body";
    body.id = `panel-${panel.id}`;
    content.append(head, body);
    item.append(content);
    grid.append(item);
    bodies[panel.id] = body;
  }
  const gs = window.GridStack.init({ column: 12, cellHeight: 80, margin: 4, handle: ".panel-head", float: false }, grid);
  gs.on("change", () => {
    const items = gs.save(false).map(({ id, x, y, w, h }) => ({ id, x, y, w, h }));
    localStorage.setItem(key, JSON.stringify({ version: VERSION, items }));
  });
  return { bodies, destroy() { gs.destroy(false); } };
}
