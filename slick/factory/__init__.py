"""The factories that pick a run's parts by config: ``make_trainer`` / ``make_critic`` (in-process or Ray trainer
ranks, slick.factory.trainer) and ``make_engines`` (in-process, HTTP workers + router, or Ray engine actors,
slick.factory.engines). The room above engine/, train/ and cluster/: the loop sees one interface whichever it gets."""
