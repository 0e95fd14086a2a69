"""The words configs are written in, torch-free and below everything that reads them: nested-dict helpers
(`configtree`), the groups step schemas share (`stepconfig`; the RL steps' own groups in `rlgroups`, the base of
every group in `strict`) and what a step's config says about its work (`workload`), execution profiles (`profiles`)
and the pinned versions of the external engines (`targets`)."""
