"""The house rules of ``src/race`` beyond the import table, one file per family of rules
(``tests/test_layers.py`` holds the import table and collects these, so
``pytest tests/test_layers.py`` runs every rule). Each rule is a scan over the parsed source
that names file and line, and each has a test that plants a violation in a synthetic tree
and sees the scan catch it.

    scan.py              parsing shared by the rules: modules, imports, AST nodes, synthetic trees
    declared.py          what the source declares: an object's class, which values are FLOP budgets
    budget_rules.py      one owner per budget decision: stops, orderings, fits, step bounds
    private_rules.py     nothing reaches another module's private names or members
    vocabulary_rules.py  one home per vocabulary (phases, statuses, seeds, paths, reward grammar, ...)
    home_rules.py        one parser or constructor per thing (reward specs, step plans, RM targets, scripts)
    engine_rules.py      the engines' lifecycle, the gang's interface, one cost context

A rule recognises what it checks by a type, a call site or an import, not by how a variable
is spelled: a budget by ``BudgetField`` or the guard's validators (``declared.py``), the
guard's ``fits`` by its import or a ``BudgetGuard``, an engine's attribute only in a module
that can hold an engine. Rules that still read a name, because nothing else marks what they
look for: a seed in ``seed * k + step`` (``seed`` / ``*_seed``), a reward spec string (a name
holding ``reward``, not a typed column), the cost context's loose parameters (``shape``,
``lora``, ``conventions``), a step's bound in a sum (a call of ``bound`` / ``*_bound``).
"""
