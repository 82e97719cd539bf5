"""Reporting: report.json/md (``report``), the HTML report (``html`` and its sections), charts, bench tables."""
