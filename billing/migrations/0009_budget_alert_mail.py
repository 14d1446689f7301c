"""A budget alert's mail is marked sent only once the mail server took it: ``mail_due`` until then, so a
failed send is tried again by the next check; ``mailed_at`` says when it went. Alerts recorded before this
had their one try already."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("billing", "0008_group_invoices")]

    operations = [
        migrations.AlterField(
            model_name="budgetalert",
            name="sent_at",
            field=models.DateTimeField(
                default=django.utils.timezone.now, help_text="When it was recorded, shown and pushed."
            ),
        ),
        migrations.AddField(
            model_name="budgetalert",
            name="mail_due",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Its mail is still to go out: a failed send is tried again.",
            ),
        ),
        migrations.AddField(
            model_name="budgetalert",
            name="mailed_at",
            field=models.DateTimeField(blank=True, help_text="When the mail server took its mail.", null=True),
        ),
    ]
