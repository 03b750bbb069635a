// Small DOM helpers shared by the panels.
const SVG = "http://www.w3.org/2000/svg";

// An SVG element with its attributes.
export function svgEl(tag, attrs = {}) {
  const e = document.createElementNS(SVG, tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, String(v)));
  return e;
}

// An HTML element with its attributes and text.
export function el(tag, attrs = {}, text = "") {
  const e = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
  if (text) e.textContent = text;
  return e;
}

// A number as a person reads it in a table: integers as they are, others to 3 decimals, "–" for none.
export const fmt = (x) => (x == null ? "–" : Number.isInteger(x) ? String(x) : x.toFixed(3));
