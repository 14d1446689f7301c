from django.urls import path

from billing import finance, grants, group_pages, invoices, views, wallet

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
    path("groups/", group_pages.billed_groups, name="billing-groups"),
    path("groups/<int:group_id>/stop/", group_pages.unbill_group, name="billing-group-unbill"),
    path("group-invoices/<int:number>/", group_pages.group_invoice_page, name="billing-group-invoice"),
    path("group-invoices/<int:number>/csv/", group_pages.group_invoice_csv, name="billing-group-invoice-csv"),
]
