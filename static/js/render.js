// Render jobs page. The scene goes up before the form: in parts of at most data-part-bytes each, with the tus
// protocol (vendored tus-js-client; sessions/render/tus.py is the server), so no request is large, an upload cut
// off resumes where it stopped (also after the page is reloaded: tus-js-client keeps the upload's address in
// localStorage), and the bar follows every part. The file's SHA-256 is computed (vendored js-sha256) as each part
// is accepted; then the form is sent through htmx with the upload's address and that hash, which the server
// compares with what arrived before it records the job.
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

  function cookie(name) {
    var found = document.cookie.split(";").map(function (part) { return part.trim(); })
      .filter(function (part) { return part.indexOf(name + "=") === 0; })[0];
    return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
  }

  // The SHA-256 of the bytes the server has accepted, in order: a part is hashed once it is stored, and a part
  // the server already had when the upload resumed is read again from the file.
  function Hasher(file) {
    var state = window.sha256.create();
    var hashed = 0;
    var queue = Promise.resolve();
    this.upTo = function (offset) {
      queue = queue.then(function () {
        if (offset <= hashed) { return undefined; }
        return file.slice(hashed, offset).arrayBuffer().then(function (bytes) {
          state.update(bytes);
          hashed = offset;
        });
      });
      return queue;
    };
    this.hex = function () { return queue.then(function () { return state.hex(); }); };
  }

  function Bar(form) {
    var bar = document.getElementById("upload-progress");
    var words = document.getElementById("upload-progress-text");
    var error = form.querySelector("[data-upload-error]");
    this.show = function (done, total, text) {
      bar.hidden = false;
      bar.max = total || 1;
      bar.value = done;
      bar.textContent = Math.floor(100 * done / (total || 1)) + " %";
      words.textContent = text;
    };
    this.fail = function (text) {
      error.hidden = false;
      error.textContent = text;
      words.textContent = "";
    };
    this.clear = function () { error.hidden = true; error.textContent = ""; };
  }

  function refusal(failure) {
    var response = failure && failure.originalResponse;
    var body = response && response.getBody && response.getBody();
    if (body) { return body.trim(); }
    return "The upload stopped: " + (failure && failure.message ? failure.message : "the connection was lost") +
      ". Send the form again to resume it.";
  }

  function upload(form, file, bar, done) {
    var hasher = new Hasher(file);
    var started = Date.now();
    var sending = new window.tus.Upload(file, {
      endpoint: form.getAttribute("data-scene-upload"),
      chunkSize: Number(form.getAttribute("data-part-bytes")),
      retryDelays: [0, 1000, 3000, 5000, 10000, 20000],
      metadata: {filename: file.name},
      headers: {"X-CSRFToken": cookie("csrftoken")},
      storeFingerprintForResuming: true,
      removeFingerprintOnSuccess: true,
      onProgress: function (sent, total) {
        var seconds = (Date.now() - started) / 1000;
        bar.show(sent, total, "Uploading " + file.name + ": " + Math.floor(100 * sent / total) + " % of " +
          size(total) + (seconds > 2 ? " (" + size(sent / seconds) + "/s)" : ""));
      },
      onChunkComplete: function (_part, accepted) { hasher.upTo(accepted); },
      onError: function (failure) { done(refusal(failure)); },
      onSuccess: function () {
        bar.show(file.size, file.size, "Uploaded " + size(file.size) + ". Checking its SHA-256…");
        hasher.upTo(file.size).then(function () { return hasher.hex(); }).then(function (hex) {
          done("", sending.url.replace(/\/$/, "").split("/").pop(), hex);
        }, function () { done("The file could not be read again to check it; choose it again."); });
      },
    });
    sending.findPreviousUploads().then(function (previous) {
      if (previous.length) { sending.resumeFromPreviousUpload(previous[0]); }
      sending.start();
    });
  }

  // htmx asks before it sends the form: a chosen file goes up first, then the form is sent with its address.
  document.addEventListener("htmx:confirm", function (event) {
    var form = event.detail.elt;
    if (!form || !form.hasAttribute || !form.hasAttribute("data-scene-upload")) { return; }
    var picker = form.querySelector("[data-scene-file]");
    var file = picker && picker.files && picker.files[0];
    if (!file) { return; } // an upload already named in the form (sent again after a refused setting), or none
    if (!window.tus || !window.tus.isSupported || !window.sha256) { return; }
    event.preventDefault();
    var bar = new Bar(form);
    var button = form.querySelector("button[type=submit]");
    bar.clear();
    if (button) { button.disabled = true; }
    bar.show(0, file.size, "Starting the upload of " + file.name + "…");
    upload(form, file, bar, function (failure, token, hex) {
      if (button) { button.disabled = false; }
      if (failure) { bar.fail(failure); return; }
      form.querySelector("input[name=upload]").value = token;
      form.querySelector("input[name=sha256]").value = hex;
      picker.value = "";
      bar.show(file.size, file.size, "Uploaded " + size(file.size) + ". Checking the scene…");
      event.detail.issueRequest(true);
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
