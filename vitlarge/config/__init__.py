"""The run's configuration: the schema (`schema`); loading a recipe with overrides (`load`), the overrides
(`overrides`; read from files by `override_files`; typed by `coerce`), the checks of a loaded config (`checks`: types;
ranges in `schema`; the profile window, `profile_window`; the trackers, `trackers`) and the ``train.phases`` list
(`phase_list`)."""
