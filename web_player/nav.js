// Page chrome shared by every view: breadcrumbs, links that keep the token, the error banner.
import { pageUrl } from "./net/api.js";

export function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message || "";
  box.hidden = !message;
}

// A goal id is a path (Family/Sub): each name is encoded, the slashes stay.
export function encGoal(id) {
  return id.split("/").map(encodeURIComponent).join("/");
}

export function link(label, path) {
  const a = document.createElement("a");
  a.href = pageUrl(path);
  a.textContent = label;
  a.dataset.nav = "";
  return a;
}

export function crumbs(items) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...items.map(([label, path], i) => {
    if (i === items.length - 1 || !path) {
      const s = document.createElement("span");
      s.textContent = label;
      return s;
    }
    return link(label, path);
  }));
}
