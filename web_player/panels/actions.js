// The action distribution: one bar per action (with its meaning), the chosen action marked.
export function actionsPanel(body, meanings) {
  const list = document.createElement("div");
  list.className = "bars";
  const rows = meanings.map((name, i) => {
    const row = document.createElement("div");
    row.className = "bar";
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = `${i}: ${name}`;
    const track = document.createElement("div");
    const fill = document.createElement("div");
    fill.className = "fill";
    track.append(fill);
    const pct = document.createElement("span");
    row.append(label, track, pct);
    list.append(row);
    return { row, fill, pct };
  });
  const note = document.createElement("p");
  note.className = "muted";
  body.append(list, note);
  return {
    show(step) {
      const { probs, action, t } = step.msg;
      if (!probs) { // a recorded action (no distribution): mark its row when the space is Discrete
        rows.forEach((r, i) => {
          r.row.classList.toggle("chosen", action === i);
          r.fill.style.width = action === i ? "100%" : "0%";
          r.pct.textContent = action === i ? "chosen" : "";
        });
        note.textContent = action == null ? ""
          : rows[action] ? `step ${t}: chose ${action}: ${meanings[action]}` : `action ${JSON.stringify(action)}`;
        body.dataset.action = action == null ? "" : JSON.stringify(action);
        return;
      }
      probs.forEach((p, i) => {
        if (!rows[i]) return;
        rows[i].fill.style.width = `${(p * 100).toFixed(1)}%`;
        rows[i].pct.textContent = p.toFixed(3);
        rows[i].row.classList.toggle("chosen", action === i);
      });
      note.textContent = action == null ? "distribution at the first observation" : `step ${t}: chose ${meanings[action] ?? action}`;
      body.dataset.probs = probs.map((p) => p.toFixed(4)).join(",");
      body.dataset.action = action == null ? "" : String(action);
    },
  };
}
