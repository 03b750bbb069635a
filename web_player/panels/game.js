// The game panel: the screen of the step shown (live or scrubbed) and, beside it, what the agent
// observes (the newest frame of its observation stack, or the numbers of a small vector observation).
export function gamePanel(body) {
  body.classList.add("game");
  const screenFig = document.createElement("figure");
  const img = document.createElement("img");
  img.alt = "game frame";
  const screenCap = document.createElement("figcaption");
  screenCap.textContent = "screen";
  screenFig.append(img, screenCap);
  const obsFig = document.createElement("figure");
  obsFig.className = "observation";
  const obsImg = document.createElement("img");
  obsImg.alt = "agent observation";
  const obsList = document.createElement("div");
  obsList.className = "kv";
  const obsCap = document.createElement("figcaption");
  obsCap.textContent = "agent's observation";
  obsFig.append(obsImg, obsList, obsCap);
  body.append(screenFig, obsFig);
  let shown = null;
  let shownObs = null;
  return {
    // What the frames are ("colour screen" or "render") and whether the observation is shown.
    configure(screen, showObservation) {
      screenCap.textContent = screen;
      obsFig.hidden = !showObservation;
      body.dataset.screen = screen;
    },
    showObservation(on) { obsFig.hidden = !on; body.dataset.observation = String(on); },
    show(step) {
      if (!step || !step.url) return;
      if (step.obsUrl && step.obsUrl !== shownObs) {
        shownObs = step.obsUrl;
        obsImg.src = step.obsUrl;
        obsImg.hidden = false;
        obsList.hidden = true;
      } else if (!step.obsUrl && step.msg.obs) {
        obsImg.hidden = true;
        obsList.hidden = false;
        obsList.replaceChildren(...step.msg.obs.flatMap((v, i) => {
          const k = document.createElement("span"); k.textContent = `obs[${i}]`;
          const x = document.createElement("span"); x.textContent = v == null ? "–" : Number(v).toFixed(3);
          return [k, x];
        }));
      }
      if (step.url === shown) return;
      shown = step.url;
      img.src = step.url;
      body.dataset.t = String(step.msg.t);
      body.dataset.seq = String(step.msg.seq);
      body.dataset.frames = String(Number(body.dataset.frames || 0) + 1);
    },
  };
}
