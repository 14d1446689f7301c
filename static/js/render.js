// Render jobs page: how much of a scene has gone up while htmx sends the upload form. htmx hands over its
// request before sending it, so the bar follows the request body's own progress events; without
// JavaScript the form posts as usual and the browser shows its own progress.
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
})();
