// The page's router: every page is a URL (token in the fragment); links push history, Back/Forward re-render.
import { pageUrl, token } from "./net/api.js";
import { showError } from "./nav.js";
import { projectsView, projectView, goalView, runView, datasetView } from "./pages/catalog.js";
import { replayView } from "./pages/replay.js";
import { playbackView } from "./pages/playback.js";
import { humanView } from "./pages/human.js";

const routes = [
  [/^\/$/, () => projectsView()],
  [/^\/projects\/([^/]+)$/, (p) => projectView(p)],
  [/^\/projects\/([^/]+)\/goals\/(.+)$/, (p, g) => goalView(p, g)],  // nested goal ids keep their '/' 
  [/^\/runs\/([^/]+)$/, (r) => runView(r)],
  [/^\/runs\/([^/]+)\/checkpoints\/(\d+)$/, (r, s) => playbackView(r, Number(s))],
  [/^\/human\/(.+)$/, (g) => humanView(g)],  // play a goal yourself (nested goal ids keep their '/')
  [/^\/datasets\/([^/]+)$/, (d) => datasetView(d)],
  [/^\/datasets\/([^/]+)\/episodes\/(\d+)$/, (d, k) => replayView(d, Number(k))],  // a recorded episode
];

let cleanup = null;

export function navigate(path) {
  history.pushState(null, "", pageUrl(path));
  render();
}

async function render() {
  if (cleanup) { cleanup(); cleanup = null; }
  showError("");
  const main = document.getElementById("main");
  main.replaceChildren();
  const path = decodeURIComponent(location.pathname).replace(/\/+$/, "") || "/";
  for (const [re, view] of routes) {
    const m = re.exec(path);
    if (m) {
      try {
        cleanup = (await view(...m.slice(1))) || null;
      } catch (e) {
        showError(e.message || String(e));
      }
      return;
    }
  }
  showError(`no page ${path}`);
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[data-nav]");
  if (!a || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
  ev.preventDefault();
  const url = new URL(a.href);
  navigate(url.pathname + url.search); // a query (?cell=, ?seed=) travels with the link
});
window.addEventListener("popstate", render);
token(); // keep the token of the launch URL for this tab
render();
