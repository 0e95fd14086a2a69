"""Jobs on this machine: a job's directory under $NEMOTRON_HOME/jobs and its status (`dirs`), job.yaml as a typed
record (`record`), and the index `jobs ls` pages through, on SQLite (`index`) or the team's PostgreSQL
(`index_pg`), with what both share (`index_schema`)."""
