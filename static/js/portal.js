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
})();
