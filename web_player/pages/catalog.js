// Catalog pages: projects → goals → runs → checkpoints, each a sortable, searchable table; a goal's
// datasets → their episodes, each opening its playback (pages/replay.js).
import { getJson } from "../net/api.js";
import { dataTable } from "../table.js";
import { crumbs, encGoal, link } from "../nav.js";

const enc = encodeURIComponent;
const fmt = (x, d = 2) => (x == null ? null : Number(x).toFixed(d));

function heading(main, text, sub) {
  const h = document.createElement("h1");
  h.textContent = text;
  main.append(h);
  if (sub) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = sub;
    main.append(p);
  }
}

export async function projectsView() {
  crumbs([["projects"]]);
  const page = await getJson("/projects");
  const main = document.getElementById("main");
  heading(main, "Projects", `runs from ${page.stores.control}`);
  dataTable(main, {
    searchLabel: "Search projects",
    rows: page.projects,
    columns: [
      { key: "project", label: "project", render: (r) => link(r.title || r.project, `/projects/${enc(r.project)}`) },
      { key: "description", label: "description" },
      { key: "goals", label: "goals" },
      { key: "runs", label: "runs" },
    ],
  });
}

export async function projectView(project) {
  const page = await getJson(`/projects/${enc(project)}`);
  crumbs([["projects", "/"], [page.title || project]]);
  const main = document.getElementById("main");
  heading(main, page.title || project, page.description);
  dataTable(main, {
    searchLabel: "Search goals",
    rows: page.goals,
    columns: [
      { key: "family", label: "family", value: (r) => r.family || "" },
      { key: "goal_id", label: "goal", render: (r) => link(r.goal_id, `/projects/${enc(project)}/goals/${encGoal(r.goal_id)}`) },
      { key: "title", label: "title", value: (r) => r.error ? `contract error: ${r.error}` : r.title },
      { key: "env", label: "environment" },
      { key: "runs", label: "runs" },
    ],
  });
}

export async function goalView(project, goal) {
  const page = await getJson(`/projects/${enc(project)}/goals/${encGoal(goal)}`);
  crumbs([["projects", "/"], [project, `/projects/${enc(project)}`], [goal]]);
  const main = document.getElementById("main");
  heading(main, goal, page.error ? `contract error: ${page.error}` : page.title);
  if (!page.error) {
    const bar = document.createElement("p");
    bar.append(link("▶ Play yourself (keyboard)", `/human/${encGoal(goal)}`));
    main.append(bar);
  }
  dataTable(main, {
    searchLabel: "Search runs",
    rows: page.runs,
    columns: [
      { key: "run_id", label: "run", render: (r) => link(r.run_id, `/runs/${enc(r.run_id)}`) },
      { key: "recipe_id", label: "recipe" },
      { key: "seed", label: "seed" },
      { key: "outcome", label: "outcome" },
      { key: "final_step", label: "final step" },
      { key: "promoted_step", label: "promoted step" },
      { key: "best_return_mean", label: "best eval mean", value: (r) => r.best_return_mean,
        render: (r) => r.best_return_mean == null ? "–"
          : `${fmt(r.best_return_mean)}${r.best_return_ci95 ? ` [${fmt(r.best_return_ci95[0])}, ${fmt(r.best_return_ci95[1])}]` : ""}` },
      { key: "started_at", label: "started", render: (r) => new Date(r.started_at).toLocaleString() },
      { key: "duration_s", label: "duration (s)", value: (r) => r.duration_s },
    ],
  });
  const h = document.createElement("h2");
  h.textContent = "Datasets";
  h.id = "datasets";
  main.append(h);
  if (!page.datasets.length) {
    const p = document.createElement("p");
    p.className = "muted";
    p.id = "datasets-note";
    p.textContent = page.datasets_error ? `the dataset store could not be read: ${page.datasets_error}`
      : "no datasets of this goal (gradlab dataset record NAME --goal GOAL ...)";
    main.append(p);
    return;
  }
  dataTable(main, {
    searchLabel: "Search datasets",
    rows: page.datasets,
    columns: [
      { key: "name", label: "dataset", render: (r) => link(r.name, `/datasets/${enc(r.name)}`) },
      { key: "agent", label: "agent" },
      { key: "episodes", label: "episodes" },
      { key: "steps", label: "steps" },
      { key: "return_mean", label: "return mean", value: (r) => r.return_mean, render: (r) => fmt(r.return_mean) },
      { key: "frames", label: "frames", value: (r) => (r.frames ? "recorded" : "no") },
      { key: "play", label: "play", value: () => "", render: (r) => link("▶ episode 0", `/datasets/${enc(r.name)}/episodes/0`) },
      { key: "created_at", label: "created", render: (r) => new Date(r.created_at).toLocaleString() },
    ],
  });
}

export async function datasetView(name) {
  const page = await getJson(`/datasets/${enc(name)}`);
  const project = page.project;
  crumbs([["projects", "/"], ...(project ? [[project, `/projects/${enc(project)}`],
    [page.goal_id, `/projects/${enc(project)}/goals/${encGoal(page.goal_id)}`]] : [[page.goal_id]]), [name]]);
  const main = document.getElementById("main");
  const s = page.summary;
  heading(main, `dataset ${name}`, `${page.goal_id} · ${s.agent} · ${s.episodes} episodes, ${s.steps} steps · frames ${s.frames ? "recorded" : "not recorded"} · ${s.determinism} · sha256 ${s.sha256.slice(0, 16)}`);
  dataTable(main, {
    searchLabel: "Search episodes",
    rows: page.episodes,
    columns: [
      { key: "index", label: "episode", value: (r) => r.index, render: (r) => link(`▶ ${r.index}`, `/datasets/${enc(name)}/episodes/${r.index}`) },
      { key: "seed", label: "seed" },
      { key: "outcome", label: "outcome" },
      { key: "reason", label: "reason" },
      { key: "length", label: "length" },
      { key: "return", label: "return", value: (r) => r.return, render: (r) => fmt(r.return) },
      { key: "raw_return", label: "raw return", value: (r) => r.raw_return, render: (r) => fmt(r.raw_return) },
    ],
  });
}

export async function runView(run) {
  const page = await getJson(`/runs/${enc(run)}`);
  const project = page.project;
  crumbs([["projects", "/"], ...(project ? [[project, `/projects/${enc(project)}`],
    [page.goal_id, `/projects/${enc(project)}/goals/${encGoal(page.goal_id)}`]] : [[page.goal_id]]), [run]]);
  const main = document.getElementById("main");
  heading(main, run, `${page.goal_id}/${page.recipe_id} · seed ${page.seed} · ${page.outcome ?? "no receipt"}`);
  dataTable(main, {
    searchLabel: "Search checkpoints",
    rows: page.checkpoints,
    columns: [
      { key: "step", label: "step", render: (r) => link(String(r.step), `/runs/${enc(run)}/checkpoints/${r.step}`) },
      { key: "purpose", label: "purpose" },
      { key: "evaluation", label: "evaluation" },
      { key: "return_mean", label: "return mean", value: (r) => r.return_mean, render: (r) => fmt(r.return_mean) ?? "–" },
      { key: "promoted", label: "promoted", value: (r) => (r.promoted ? "promoted" : ""), render: (r) => (r.promoted ? "★ promoted" : "") },
      { key: "size_bytes", label: "size (KiB)", value: (r) => r.size_bytes, render: (r) => (r.size_bytes / 1024).toFixed(1) },
      { key: "sha256", label: "sha256", value: (r) => r.sha256.slice(0, 16) },
    ],
  });
}
