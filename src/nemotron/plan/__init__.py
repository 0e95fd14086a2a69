"""The resource plan, torch-free: where the executor places a job (`placement`), model shapes read from checkpoints or
known configs (`shapes`), the process groups a job runs and the models each holds, one engine at a time (`groups`),
what group 0 of a heterogeneous job serves (`served`), and the memory terms per device with the verdict whether each
group fits (`terms`). docs/cluster.md, "The resource plan", gives the formulas."""
