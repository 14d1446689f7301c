"""A budget alert's mail that failed for a week is given up on the record: ``mail_given_up_at`` says when,
``mail_error`` what the last try was told, and the admin lists them for staff."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("billing", "0011_billed_group_changes")]

    operations = [
        migrations.AddField(
            model_name="budgetalert",
            name="mail_error",
            field=models.CharField(blank=True, help_text="Why its mail's last send failed.", max_length=300),
        ),
        migrations.AddField(
            model_name="budgetalert",
            name="mail_given_up_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its mail, failing for a week, was given up: it never went out.",
                null=True,
            ),
        ),
    ]
