"""What a task is, with no Redis in sight: the task model and its validation, schedules
(interval, cron, once; misfire policy), the name pattern and enums defined once, and the
typed errors every layer raises; and ``ApiKey``, who may sign API requests, which both the
node's config and the API's signing use.

May import: ``runtime.config`` (name checks, the strict converter); nothing else of the
project, and no Redis, trio or HTTP (checked: ``lint-imports``).
"""
