// The scrubber over the current episode's retained steps: moving it pauses play and shows that step.
export function scrubberPanel(body, { onScrub, onLive }) {
  const row = document.createElement("div");
  row.className = "scrub";
  const range = document.createElement("input");
  range.type = "range";
  range.min = "0";
  range.max = "0";
  range.value = "0";
  range.setAttribute("aria-label", "scrub");
  const label = document.createElement("span");
  const live = document.createElement("button");
  live.textContent = "Live";
  row.append(range, label, live);
  body.append(row);
  range.addEventListener("input", () => onScrub(Number(range.value)));
  live.addEventListener("click", onLive);
  return {
    range,
    show(steps, index, isLive) {
      range.max = String(Math.max(steps.length - 1, 0));
      range.value = String(index);
      const step = steps[index];
      if (step) body.dataset.t = String(step.msg.t);
      label.textContent = step ? `t=${step.msg.t} of ${steps[steps.length - 1].msg.t}${isLive ? "" : " (scrubbed)"}` : "";
    },
  };
}
