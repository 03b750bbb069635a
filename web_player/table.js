// A sortable, searchable table: click a header to sort, type in the box to filter rows.
export function dataTable(container, { columns, rows, searchLabel = "Search" }) {
  const wrap = document.createElement("div");
  const bar = document.createElement("div");
  bar.className = "toolbar";
  const search = document.createElement("input");
  search.type = "search";
  search.placeholder = searchLabel;
  search.setAttribute("aria-label", searchLabel);
  const count = document.createElement("span");
  count.className = "muted";
  bar.append(search, count);
  const table = document.createElement("table");
  table.className = "data";
  const thead = table.createTHead().insertRow();
  const tbody = table.createTBody();
  let sortKey = null, sortDir = 1;
  columns.forEach((col) => {
    const th = document.createElement("th");
    th.textContent = col.label;
    th.dataset.key = col.key;
    th.addEventListener("click", () => {
      sortDir = sortKey === col.key ? -sortDir : 1;
      sortKey = col.key;
      thead.querySelectorAll("th").forEach((h) => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      render();
    });
    thead.append(th);
  });
  function value(row, col) { return col.value ? col.value(row) : row[col.key]; }
  function render() {
    const q = search.value.trim().toLowerCase();
    let shown = rows.filter((r) => !q || columns.some((c) => String(value(r, c) ?? "").toLowerCase().includes(q)));
    if (sortKey) {
      const col = columns.find((c) => c.key === sortKey);
      shown = shown.slice().sort((a, b) => {
        const x = value(a, col), y = value(b, col);
        if (x == null) return 1;
        if (y == null) return -1;
        return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * sortDir;
      });
    }
    tbody.replaceChildren(...shown.map((r) => {
      const tr = document.createElement("tr");
      columns.forEach((c) => {
        const td = tr.insertCell();
        const cell = c.render ? c.render(r) : value(r, c);
        if (cell instanceof Node) td.append(cell); else td.textContent = cell ?? "–";
      });
      return tr;
    }));
    count.textContent = `${shown.length} of ${rows.length}`;
  }
  search.addEventListener("input", render);
  render();
  wrap.append(bar, table);
  container.append(wrap);
  return { search, table };
}
