"""Results as people read them: the view model built from a ResultSet, the jinja2 templates and the filters
that escape what came from results, SVG plots, links to the runs, the terminal table, and the nightly triage's
table with the `harness triage` command around it (triage_view).

Runs wherever a report is rendered (`harness report`, `harness triage`, the end of `harness run`, the workflow's
report job), from results folders alone (`harness triage` also reads runners.yaml for the bisect jobs' labels)."""
