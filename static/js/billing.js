// Live regions on the notification socket (the dashboard, the billing page): billing's notices and
// figures fetch again when money moved (a charge, a zero balance, a budget alert), the dashboard's session
// notices (a spot reclaim, an idle or age warning) when one is given or withdrawn.
(function () {
  "use strict";
  var regions = document.querySelector("[data-billing-live], #session-warnings");
  if (!regions || !window.WebSocket || !window.htmx || !window.Portal) {
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
