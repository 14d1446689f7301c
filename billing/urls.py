from django.urls import path

from billing import grants, views, wallet

urlpatterns = [
    path("", wallet.account, name="billing-account"),
    path("budget/", wallet.budget, name="billing-budget"),
    path("notices/", wallet.notices, name="billing-notices"),
    path("holdings/<int:slice_id>/cost/", wallet.holding_cost, name="billing-holding-cost"),
    path("credit/", grants.credit_page, name="billing-credit"),
    path("credit/budgets/", grants.budget_page, name="billing-budgets"),
    path("finance/", views.finance, name="billing-finance"),
    path("prices/", views.price_list, name="billing-prices"),
]
