"""Results as people read them: the view model built from a ResultSet, the jinja2 templates and the filters
that escape what came from results, SVG plots, links to the runs, and the terminal table.

Runs wherever a report is rendered (`harness report`, the end of `harness run`, the workflow's report job),
from results folders alone."""
