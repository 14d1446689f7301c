// A render job's page: its progress as the render worker pushes it (/ws/render/<job>/). The region marked
// data-render-progress holds elements named by data-field (frames_done, frames_total, percent, sample,
// samples, seconds_per_frame, eta, cost, state_label, device, log_tail, thumbnail); each is filled with
// textContent (an image's src for the thumbnail), never as markup. When the job ends the page is loaded
// again, so its gallery and actions come from the server.
(function () {
  "use strict";
  var region = document.querySelector("[data-render-progress]");
  if (!region || !window.WebSocket || !window.Portal) { return; }
  var ENDED = {done: true, failed: true, cancelled: true};
  var shownState = region.getAttribute("data-state");

  function put(name, value) {
    var found = region.querySelectorAll('[data-field="' + name + '"]');
    for (var i = 0; i < found.length; i += 1) {
      var element = found[i];
      if (element.tagName === "PROGRESS") {
        element.value = Number(value) || 0;
      } else if (element.tagName === "IMG") {
        if (value) { element.src = value; element.hidden = false; }
      } else {
        element.textContent = value === null || value === undefined ? "—" : String(value);
      }
    }
  }

  var badge = document.querySelector("[data-render-badge]");  // the job's state at the top of the page

  window.Portal.liveSocket(region.getAttribute("data-render-progress"), function (message) {
    if (message.type !== "render.progress") { return; }
    put("state_label", message.state_label);
    if (badge && message.state_label) { badge.textContent = String(message.state_label); }
    put("frames_done", message.frames_done);
    put("frames_total", message.frames_total);
    put("percent", message.percent);
    // Times come in words from the server (progress.duration), as the page shows them when it loads.
    put("seconds_per_frame", message.per_frame_shown);
    put("eta", message.eta_shown);
    put("cost", message.cost || null);
    put("thumbnail", message.thumbnail);
    if (message.device) { put("device", message.device); }
    if (message.samples) { put("sample", message.sample); put("samples", message.samples); }
    if (message.log_tail) { put("log_tail", message.log_tail.join("\n")); }
    if (message.state !== shownState && ENDED[message.state]) { window.location.reload(); }
    shownState = message.state;
  });
})();
