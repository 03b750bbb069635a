// The game panel: the screen of the step shown (live or scrubbed) and, beside it, what the agent
// observes (the newest frame of its observation stack, or the numbers of a small vector observation).
//
// Frames are object URLs the page makes from the frames the server sends. Each is decoded off-screen
// before its <img> takes it: an <img> whose src changes shows nothing until the new image has
// loaded, so swapping at once makes the screen blink, and a URL revoked while it still loads shows a
// broken image. The panel owns the URLs it is given: a page hands back the ones it is done with
// through retire(), and a URL still being decoded is revoked once its decode settles.
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
  let wanted = null;       // the screen URL asked for last
  let onScreen = null;     // the screen URL shown
  let wantedObs = null;
  const decoding = new Set();  // URLs being decoded
  const retired = new Set();   // URLs retired while being decoded: revoked when that settles

  // Decodes `url` off-screen, then hands it to `target` unless a frame asked for later is already
  // there (a frame asked for earlier never replaces a later one; under load some are skipped).
  const slot = (target) => {
    let asked = 0, shownAt = 0;
    return (url, onShown) => {
      const n = ++asked;
      decoding.add(url);
      const pre = new Image();
      pre.src = url;
      pre.decode().then(() => {
        if (n <= shownAt) return;
        shownAt = n;
        target.src = url;  // decoded already: the swap is synchronous, the element never shows nothing
        onShown();
      }, () => {}).finally(() => {  // a decode fails only for a URL retired before it loaded: skipped
        decoding.delete(url);
        if (retired.delete(url)) URL.revokeObjectURL(url);
      });
    };
  };
  const present = slot(img);
  const presentObs = slot(obsImg);

  return {
    // What the frames are ("colour screen" or "render") and whether the observation is shown.
    configure(screen, showObservation) {
      screenCap.textContent = screen;
      obsFig.hidden = !showObservation;
      body.dataset.screen = screen;
    },
    showObservation(on) { obsFig.hidden = !on; body.dataset.observation = String(on); },
    // Shows `step` ({msg, url, obsUrl}); data-t, data-seq and data-frames change, and `onShown`
    // runs, when its frame is on screen. Returns whether the step has a frame to show.
    show(step, onShown = () => {}) {
      if (!step || !step.url) return false;
      if (step.obsUrl && step.obsUrl !== wantedObs) {
        wantedObs = step.obsUrl;
        presentObs(step.obsUrl, () => { obsImg.hidden = false; obsList.hidden = true; });
      } else if (!step.obsUrl && step.msg.obs) {
        obsImg.hidden = true;
        obsList.hidden = false;
        obsList.replaceChildren(...step.msg.obs.flatMap((v, i) => {
          const k = document.createElement("span"); k.textContent = `obs[${i}]`;
          const x = document.createElement("span"); x.textContent = v == null ? "–" : Number(v).toFixed(3);
          return [k, x];
        }));
      }
      if (step.url === wanted) {  // asked for already: its own callback runs when it is shown
        if (step.url === onScreen) onShown();
        return true;
      }
      wanted = step.url;
      present(step.url, () => {
        onScreen = step.url;
        body.dataset.t = String(step.msg.t);
        body.dataset.seq = String(step.msg.seq);
        body.dataset.frames = String(Number(body.dataset.frames || 0) + 1);
        onShown();
      });
      return true;
    },
    // Hands back object URLs the page no longer needs (null entries are skipped).
    retire(...urls) {
      for (const url of urls) {
        if (!url) continue;
        if (decoding.has(url)) retired.add(url); else URL.revokeObjectURL(url);
      }
    },
  };
}
