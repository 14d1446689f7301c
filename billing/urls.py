from django.urls import path

from billing import finance, grants, invoices, views, wallet

urlpatterns = [
    path("", wallet.account, name="billing-account"),
    path("budget/", wallet.budget, name="billing-budget"),
    path("notices/", wallet.notices, name="billing-notices"),
    path("holdings/<int:slice_id>/cost/", wallet.holding_cost, name="billing-holding-cost"),
    path("credit/", grants.credit_page, name="billing-credit"),
    path("credit/budgets/", grants.budget_page, name="billing-budgets"),
    path("finance/", finance.overview, name="billing-finance"),
    path("finance/usages/", finance.usages, name="billing-finance-usages"),
    path("finance/usages/<int:usage_id>/", finance.usage_detail, name="billing-finance-usage"),
    path("prices/", views.price_list, name="billing-prices"),
    path("invoices/<int:number>/", invoices.invoice_page, name="billing-invoice"),
    path("invoices/<int:number>/csv/", invoices.invoice_csv, name="billing-invoice-csv"),
    path("invoices/<int:number>/credit-note/", invoices.reverse_invoice, name="billing-invoice-reverse"),
]
