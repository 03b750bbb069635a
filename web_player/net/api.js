// The JSON API: every call carries the launch token (from the URL fragment) in a header.
export const PROTOCOL = 1;

export function token() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (m) sessionStorage.setItem("gradlab.token", decodeURIComponent(m[1]));
  return sessionStorage.getItem("gradlab.token") || "";
}

// A same-origin URL for a page, keeping the token in the fragment so the link can be reloaded or shared.
export function pageUrl(path) {
  return `${path}#token=${encodeURIComponent(token())}`;
}

export class ApiError extends Error {}

export async function getJson(path) {
  const res = await fetch(`/api${path}`, { headers: { "X-Gradlab-Token": token() }, cache: "no-store" });
  let body = null;
  try { body = await res.json(); } catch { body = null; }
  if (!res.ok) throw new ApiError((body && body.detail) || `${res.status} ${res.statusText}`);
  if (!body || body.protocol !== PROTOCOL) {
    throw new ApiError(`protocol mismatch: the server speaks ${body && body.protocol}, this page ${PROTOCOL}; reload the page`);
  }
  return body;
}
