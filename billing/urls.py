from django.urls import path

from billing import views

urlpatterns = [
    path("", views.account, name="billing-account"),
    path("finance/", views.finance, name="billing-finance"),
    path("prices/", views.price_list, name="billing-prices"),
]
