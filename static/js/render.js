// Render jobs page: how much of a scene has gone up while htmx sends the upload form. htmx hands over its
// request before sending it, so the bar follows the request body's own progress events; without
// JavaScript the form posts as usual and the browser shows its own progress.
// The jobs list follows the person's jobs over /ws/render/: a row's frames done, its bar and its cost change
// in place (textContent only); a job that changes state has the list loaded again (its progress cell and
// actions depend on the state), through the list's own hx-trigger.
(function () {
  "use strict";

  function size(bytes) {
    var units = ["bytes", "KiB", "MiB", "GiB"];
    var unit = 0;
    while (bytes >= 1024 && unit < units.length - 1) { bytes /= 1024; unit += 1; }
    return (unit ? bytes.toFixed(1) : String(bytes)) + " " + units[unit];
  }

  document.addEventListener("htmx:beforeSend", function (event) {
    var form = event.detail.elt;
    if (!form || !form.getAttribute || !form.getAttribute("data-upload-progress")) { return; }
    var bar = document.getElementById(form.getAttribute("data-upload-progress"));
    var words = document.getElementById(form.getAttribute("data-upload-progress") + "-text");
    var button = form.querySelector("button[type=submit]");
    if (!bar || !words || !event.detail.xhr || !event.detail.xhr.upload) { return; }
    bar.hidden = false;
    bar.value = 0;
    words.textContent = "Starting the upload…";
    if (button) { button.disabled = true; }
    event.detail.xhr.upload.addEventListener("progress", function (progress) {
      if (!progress.lengthComputable || !progress.total) { return; }
      bar.max = progress.total;
      bar.value = progress.loaded;
      bar.textContent = Math.floor(100 * progress.loaded / progress.total) + " %";
      words.textContent = progress.loaded < progress.total
        ? "Uploading: " + Math.floor(100 * progress.loaded / progress.total) + " % of " + size(progress.total)
        : "Uploaded " + size(progress.total) + ". Checking the scene…";
    });
  });

  function follow(list) {
    var reloading = false;
    document.body.addEventListener("htmx:afterRequest", function () { reloading = false; });
    window.Portal.liveSocket(list.getAttribute("data-render-jobs"), function (message) {
      if (message.type !== "render.progress") { return; }
      var row = document.getElementById("render-job-" + Number(message.job));
      if (!row) { return; }
      if (row.getAttribute("data-state") !== message.state) {
        if (!reloading) {
          reloading = true;
          document.body.dispatchEvent(new CustomEvent("render-jobs-changed"));
        }
        return;
      }
      var bar = row.querySelector('progress[data-field="percent"]');
      if (bar) { bar.value = Number(message.percent) || 0; bar.textContent = bar.value + " %"; }
      var done = row.querySelector('[data-field="frames_done"]');
      if (done) { done.textContent = String(Number(message.frames_done) || 0); }
      var cost = row.querySelector('[data-field="cost"]');
      if (cost && message.cost) { cost.textContent = String(message.cost); }
    });
  }

  var list = document.querySelector("[data-render-jobs]");
  if (list && window.WebSocket && window.Portal) { follow(list); }
})();
