// The game panel: the frame of the step shown (live or scrubbed).
export function gamePanel(body) {
  body.classList.add("game");
  const img = document.createElement("img");
  img.alt = "game frame";
  body.append(img);
  let shown = null;
  return {
    show(step) {
      if (!step || !step.url || step.url === shown) return;
      shown = step.url;
      img.src = step.url;
      body.dataset.t = String(step.msg.t);
      body.dataset.seq = String(step.msg.seq);
      body.dataset.frames = String(Number(body.dataset.frames || 0) + 1);
    },
  };
}
