// Episode reports: outcome, reason, length, return (shaped and raw) of every finished episode.
export function episodePanel(body) {
  const table = document.createElement("table");
  table.className = "data";
  const head = table.createTHead().insertRow();
  ["#", "seed", "outcome", "reason", "length", "return", "raw return"].forEach((h) => {
    const th = document.createElement("th"); th.textContent = h; head.append(th);
  });
  const tbody = table.createTBody();
  const live = document.createElement("p");
  live.className = "muted";
  body.append(live, table);
  let count = 0;
  return {
    live(step) { live.textContent = `episode step ${step.msg.t} · return ${step.msg.episode_return.toFixed(2)} (raw ${step.msg.episode_raw_return.toFixed(2)})`; },
    finished(ep) {
      count += 1;
      const tr = tbody.insertRow(0);
      [count, ep.seed ?? "–", ep.outcome, ep.reason, ep.length, ep.return.toFixed(2), ep.raw_return.toFixed(2)].forEach((v) => {
        tr.insertCell().textContent = String(v);
      });
      tr.cells[2].className = `outcome-${ep.outcome}`;
      while (tbody.rows.length > 50) tbody.deleteRow(-1);
      body.dataset.episodes = String(count);
    },
  };
}
