from stabray.cli import main

raise SystemExit(main())
