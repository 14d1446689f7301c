// The dashboard's live regions, on one notification socket: billing's notices and credit card fetch again
// when money moved (as billing.js does on the billing page), the session notices (a spot reclaim, an idle
// or age warning) when one is given or withdrawn.
(function () {
  "use strict";
  if (!document.getElementById("session-warnings") || !window.WebSocket || !window.htmx || !window.Portal) {
    return;
  }
  window.Portal.liveSocket("/ws/notifications/", function (message) {
    if (typeof message.type !== "string") { return; }
    if (message.type.indexOf("billing.") === 0 || message.type === "session.changed") {
      window.htmx.trigger(document.body, "billing-changed");
    }
    if (message.type === "session.warning" || message.type === "session.changed") {
      window.htmx.trigger(document.body, "session-warning");
    }
  });
})();
