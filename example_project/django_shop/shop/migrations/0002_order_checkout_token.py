# Written by hand for Django 5.2: the checkout form's token, unique per order.
#
# Orders placed before it get a token of their own ("placed-before-tokens:<id>", which
# no form renders), then the column becomes NOT NULL and UNIQUE.

from django.db import migrations, models

HELP = "the checkout form's token: the same form posted again is this order again"


def token_each_earlier_order(apps, schema_editor):
    Order = apps.get_model("shop", "Order")
    for order in Order.objects.filter(checkout_token__isnull=True).only("pk"):
        order.checkout_token = f"placed-before-tokens:{order.pk}"
        order.save(update_fields=["checkout_token"])


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="checkout_token",
            field=models.CharField(help_text=HELP, max_length=64, null=True),
        ),
        migrations.RunPython(token_each_earlier_order, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="order",
            name="checkout_token",
            field=models.CharField(help_text=HELP, max_length=64, unique=True),
        ),
    ]
