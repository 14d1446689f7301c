// Small progressive enhancements; every page works without this file.
(function () {
  "use strict";
  // Move focus to the main region after an htmx swap of a whole page area,
  // so keyboard and screen-reader users land on the new content.
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (target && target.hasAttribute("data-focus-after-swap")) {
      target.focus();
    }
  });

  // Close codes of ours (portal/consumers.py, sessions/metrics/consumers.py): reconnecting cannot help.
  var FINAL = {4401: "logged-out", 4403: "forbidden"};

  // The one websocket helper of the live pages: a socket that comes back by itself after a dropped
  // connection or a server restart (after 1 s, doubling up to 15 s), and stays closed on our final codes.
  // onMessage gets each message parsed as JSON (anything else is skipped); onState, if given, gets
  // "live", "reconnecting", "logged-out" or "forbidden".
  function liveSocket(path, onMessage, onState) {
    var delay = 1000;
    var report = onState || function () {};
    function connect() {
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      var socket = new WebSocket(scheme + window.location.host + path);
      socket.onopen = function () { delay = 1000; report("live"); };
      socket.onmessage = function (event) {
        var message;
        try { message = JSON.parse(event.data); } catch (error) { return; }
        if (message && typeof message === "object") { onMessage(message); }
      };
      socket.onclose = function (event) {
        if (FINAL[event.code]) { report(FINAL[event.code]); return; }
        report("reconnecting");
        window.setTimeout(connect, delay);
        delay = Math.min(delay * 2, 15000);
      };
    }
    connect();
  }

  window.Portal = {liveSocket: liveSocket};
})();
