"""harness on GitHub: the REST client, `/ok to test` approval, the PR comment, the nightly issue, links to
workflow runs and jobs, Actions' inputs and outputs, and `harness init` for another repository.

Runs in the workflow's own jobs (`harness gh ...`) and locally for `harness init`; the only package that
speaks to GitHub."""
